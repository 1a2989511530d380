"""The flight recorder: the last `window` seconds of samples per GPU, in memory, for incident reports."""

from __future__ import annotations

from collections import deque

from gpuwarden.model import GpuSample


class FlightRecorder:
    def __init__(self, window: float = 900.0) -> None:
        self.window = window
        self._samples: dict[str, deque[GpuSample]] = {}

    def add(self, sample: GpuSample) -> None:
        ring = self._samples.setdefault(sample.gpu, deque())
        ring.append(sample)
        while ring and sample.time - ring[0].time > self.window:
            ring.popleft()

    def latest(self) -> dict[str, GpuSample]:
        return {gpu: ring[-1] for gpu, ring in self._samples.items() if ring}

    def history(self, gpu: str, since: float | None = None) -> list[GpuSample]:
        return [s for s in self._samples.get(gpu, ()) if since is None or s.time >= since]

    def forget(self, gpu: str) -> None:
        self._samples.pop(gpu, None)
