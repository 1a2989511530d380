"""The GPU telemetry component: read every GPU each interval without ever blocking the loop, record, export,
and apply the telemetry rules.

Each GPU has its own worker thread, a daemon thread: a read of a dying GPU can hang in D state forever, and
such a thread is abandoned, never joined. A GPU has at most one read outstanding; one that misses
`read_deadline` is `gpu_unresponsive`, and the other GPUs keep being read.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Protocol

from gpuwarden.config import GpuConfig
from gpuwarden.gpu import amd, nvidia
from gpuwarden.gpu.discovery import Gpu
from gpuwarden.gpu.recorder import FlightRecorder
from gpuwarden.gpu.rules import TelemetryRules
from gpuwarden.kernel.xid import describe
from gpuwarden.model import Event, GpuSample, Severity

log = logging.getLogger(__name__)


class Sink(Protocol):
    def record(self, events: list[Event], cursor: tuple[str, str] | None = None) -> list[int]: ...
    def resolve(self, dedupe_key: str, message: str) -> None: ...
    def replace_series(self, name: str, series: dict[tuple[str, ...], float]) -> None: ...
    def count(self, name: str, *labels: str, by: float = 1) -> None: ...


class Worker:
    """One daemon thread that runs the reads of one GPU, one at a time."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, daemon=True, name=f"read-{name}").start()

    def submit(self, fn: Callable, *args) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put((loop, future, fn, args))
        return future

    def _run(self) -> None:
        while True:
            loop, future, fn, args = self._jobs.get()
            # Reads take turns: eight Python threads fighting for the GIL cost four times the CPU of the reads
            # themselves. A read that hangs keeps its turn, so the others stop waiting for it after _TURN.
            turn = _turns.acquire(timeout=_TURN)
            try:
                result, error = fn(*args), None
            except Exception as exc:
                result, error = None, exc
            finally:
                if turn:
                    _turns.release()
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:
                pass  # the loop closed while this read hung


_turns = threading.Lock()
_TURN = 0.05


def _settle(future: asyncio.Future, result, error) -> None:
    if not future.done():
        future.set_exception(error) if error else future.set_result(result)


class GpuWatch:
    name = "gpus"

    def __init__(self, config: GpuConfig, gpus: Callable[[], list[Gpu]], sink: Sink,
                 recorder: FlightRecorder) -> None:
        self.config, self.gpus, self.sink, self.recorder = config, gpus, sink, recorder
        self.rules = TelemetryRules(config)
        self._pending: dict[str, tuple[asyncio.Future, float]] = {}
        self._unresponsive: set[str] = set()
        self._seen: dict[str, Gpu] = {}
        self._missing: set[str] = set()
        self.nvml = None
        self._nv_handles: dict[str, object] = {}
        self._durations: dict[str, float] = {}
        self._readers: dict[str, Callable[[float], GpuSample]] = {}
        self._workers: dict[str, Worker] = {}

    async def run(self) -> None:
        if self.config.nvml:
            self.nvml = await asyncio.to_thread(nvidia.load)
            if self.nvml:
                self._nv_handles = await asyncio.to_thread(nvidia.handles, self.nvml)
                log.info("NVML reader on: %d NVIDIA GPU(s)", len(self._nv_handles))
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._sample_forever())
            if self.nvml and self._nv_handles:
                tasks.create_task(self._watch_xids())

    async def _sample_forever(self) -> None:
        loop = asyncio.get_running_loop()
        tick = loop.time()
        while True:
            await self.sample_once()
            tick += self.config.interval
            await asyncio.sleep(max(0.0, tick - loop.time()))

    async def sample_once(self) -> dict[str, GpuSample]:
        loop = asyncio.get_running_loop()
        now = time.time()
        gpus = {g.pci: g for g in self.gpus()}
        self._check_missing(gpus, now)
        started = []
        for pci, gpu in gpus.items():
            if pci not in self._pending and (reader := self._reader(gpu)):
                worker = self._workers.get(pci) or self._workers.setdefault(pci, Worker(pci))
                future = worker.submit(reader, now)
                self._pending[pci] = (future, loop.time())
                started.append(future)
        if started:
            await asyncio.wait(started, timeout=min(self.config.interval, self.config.read_deadline))
        samples = {}
        for pci, (future, begun) in list(self._pending.items()):
            took = loop.time() - begun
            if future.done():
                del self._pending[pci]
                sample = self._finished(pci, gpus.get(pci), future, took)
                if sample:
                    samples[pci] = sample
            elif took > self.config.read_deadline and pci not in self._unresponsive:
                self._unresponsive.add(pci)
                self.sink.record([Event("gpu_unresponsive", Severity.CRITICAL,
                                        f"reading GPU {pci} has not returned for {took:.1f} s: the driver or the GPU "
                                        "hangs (the read is abandoned)", now, gpu=pci,
                                        evidence={"read_seconds": round(took, 2), "runbook": "device_lost"})])
                self.sink.count("gpuwarden_gpu_read_errors_total", pci, "timeout")
        self._export(samples, gpus)
        for change in self.rules.evaluate(samples or self.recorder.latest(), now):
            if change.event:
                self.sink.record([change.event])
            else:
                self.sink.resolve(change.dedupe_key, change.message)
        return samples

    def _reader(self, gpu: Gpu) -> Callable[[float], GpuSample] | None:
        if gpu.pci in self._readers:
            return self._readers[gpu.pci]
        reader = None
        if gpu.vendor == "amd" and gpu.driver == "amdgpu":
            reader = amd.AmdReader(self.config.sysfs_root / "bus/pci/devices" / gpu.pci, gpu.pci).read
        elif gpu.vendor == "nvidia" and gpu.pci in self._nv_handles:
            nvml, handle = self.nvml, self._nv_handles[gpu.pci]
            reader = partial(nvidia.read, nvml, handle, gpu.pci)
        if reader:
            self._readers[gpu.pci] = reader
        return reader

    def _finished(self, pci: str, gpu: Gpu | None, future: asyncio.Future, took: float) -> GpuSample | None:
        if pci in self._unresponsive:
            self._unresponsive.discard(pci)
            self.sink.resolve(f"gpu_unresponsive:{pci}", f"GPU {pci} answers reads again")
        if future.exception() is not None:
            log.warning("reading GPU %s failed: %s", pci, future.exception())
            self.sink.count("gpuwarden_gpu_read_errors_total", pci, "error")
            return None
        sample: GpuSample = future.result()
        for state in set(sample.problems.values()):
            self.sink.count("gpuwarden_gpu_read_errors_total", pci, state)
        self.recorder.add(sample)
        self._durations[pci] = took
        return sample

    def _check_missing(self, gpus: dict[str, Gpu], now: float) -> None:
        for pci, gpu in gpus.items():
            self._seen[pci] = gpu
            if pci in self._missing:
                self._missing.discard(pci)
                self.sink.resolve(f"gpu_missing:{pci}", f"GPU {pci} is back")
        for pci in set(self._seen) - set(gpus) - self._missing:
            self._missing.add(pci)
            self.recorder.forget(pci)
            self._readers.pop(pci, None)
            self.sink.record([Event("gpu_missing", Severity.CRITICAL, f"GPU {pci} ({self._seen[pci].vendor}) "
                                    "disappeared from the PCI bus", now, gpu=pci, evidence={"runbook": "device_lost"})])

    def _export(self, samples: dict[str, GpuSample], gpus: dict[str, Gpu]) -> None:
        latest = {pci: s for pci, s in self.recorder.latest().items() if pci in gpus}
        for name, series in series_of(latest).items():
            self.sink.replace_series(name, series)
        up = {(pci, g.vendor, (latest.get(pci) and latest[pci].model) or ""): 1.0 if pci in samples else 0.0
              for pci, g in gpus.items()}
        self.sink.replace_series("gpuwarden_gpu_reader_up", up)
        self.sink.replace_series("gpuwarden_gpu_read_duration_seconds",
                                 {(pci,): self._durations[pci] for pci in gpus if pci in self._durations})

    async def _watch_xids(self) -> None:
        while True:
            try:
                events = await asyncio.to_thread(nvidia.xid_events, self.nvml, 1000)
            except Exception as exc:
                log.warning("NVML Xid events unavailable: %s", exc)
                return
            for pci, xid in events:
                severity, meaning = describe(xid)
                self.sink.record([Event("xid", severity, f"Xid {xid}: {meaning} on {pci} (NVML)", time.time(),
                                        gpu=pci, evidence={"xid": xid, "source": "nvml", "runbook": "xid"})])


SERIES = {  # metric -> (extra label, sample fields that fill it)
    "gpuwarden_gpu_power_watts": (None, "power_watts"),
    "gpuwarden_gpu_power_cap_watts": (None, "power_cap_watts"),
    "gpuwarden_gpu_fan_rpm": (None, "fan_rpm"),
    "gpuwarden_gpu_busy_ratio": (None, "busy_ratio"),
    "gpuwarden_gpu_voltage_volts": (None, "voltage_mv"),
    "gpuwarden_gpu_clock_hz": ("clock", {"sclk": "sclk_hz", "mclk": "mclk_hz"}),
    "gpuwarden_gpu_vram_bytes": ("kind", {"total": "vram_total_bytes", "used": "vram_used_bytes",
                                          "visible_total": "vram_visible_total_bytes"}),
    "gpuwarden_gpu_pcie_link_speed_gigatransfers": ("link", {"current": "pcie_speed_gts",
                                                             "max": "pcie_max_speed_gts"}),
    "gpuwarden_gpu_pcie_link_width": ("link", {"current": "pcie_width", "max": "pcie_max_width"}),
}


def series_of(samples: dict[str, GpuSample]) -> dict[str, dict[tuple[str, ...], float]]:
    """Prometheus series for the latest samples, labelled gpu, vendor, model (and the extra label)."""
    out: dict[str, dict[tuple[str, ...], float]] = {name: {} for name in SERIES}
    out["gpuwarden_gpu_temperature_celsius"] = {}
    for s in samples.values():
        base = (s.gpu, s.vendor, s.model or "")
        for name, (label, fields) in SERIES.items():
            for extra, attr in (fields.items() if label else [(None, fields)]):
                value = getattr(s, attr)
                if value is not None:
                    scale = 0.001 if attr == "voltage_mv" else 1.0
                    out[name][(*base, extra) if extra else base] = float(value) * scale
        for sensor, value in s.temperatures.items():
            out["gpuwarden_gpu_temperature_celsius"][(*base, sensor)] = value
    return out
