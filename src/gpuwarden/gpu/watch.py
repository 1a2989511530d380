"""The GPU telemetry component: read every GPU each interval without ever blocking the loop, record, export,
and apply the telemetry rules.

Reads run in a daemon worker thread: a read of a dying GPU can hang in D state forever, and such a thread is
abandoned, never joined. A GPU has at most one read outstanding; one that misses `read_deadline` is
`gpu_unresponsive` and stays with its hung thread, and the other GPUs keep being read by a fresh one.

The loop wakes once a round, at its point of the shared grid (runtime/ticks.py): it takes the reads it handed out
at the last one, which the worker made while the loop slept, and hands out the next. The worker's answer is a
finished future looked at then, not a wake-up of the loop; a round's readings are exported one interval after
they were read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping

from gpuwarden.config.settings import GpuConfig
from gpuwarden.core import conditions, families
from gpuwarden.core.model import Event, GpuSample, NullSink, Severity, Sink
from gpuwarden.gpu import vendors
from gpuwarden.gpu.discovery import Gpu
from gpuwarden.gpu.recorder import FlightRecorder
from gpuwarden.gpu.rules import TelemetryRules
from gpuwarden.gpu.vendors.base import Opened
from gpuwarden.gpu.xidmerge import XidMerge
from gpuwarden.kernel import xid as xid_catalog
from gpuwarden.runtime.offloop import Busy, OffLoop
from gpuwarden.runtime.ticks import next_tick

log = logging.getLogger(__name__)
# opening the vendors' libraries (NVML), waiting for their Xids: a hung driver holds these two
_LIBRARY = OffLoop("gpu library", limit=2)
_LIBRARY_DEADLINE = 30.0
# what a GPU that answers reads again, or is back on the bus, is cured of (not of a failed reset: gpu_lost)
_UNRESPONSIVE, _MISSING = frozenset({"gpu_unresponsive"}), frozenset({"gpu_missing"})


class Worker:
    """A daemon thread that runs one job at a time; `current` names the GPU it is reading now. A job's future is
    settled by the worker and wakes no loop: whoever handed it out looks at it (or awaits it, wrapped)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.current: str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"read-{name}")
        self.thread.start()

    def hand(self, future: concurrent.futures.Future, fn: Callable, *args) -> None:
        """Queue `fn(worker, *args)`, whose return or exception settles `future`."""
        self._jobs.put((future, fn, args))

    def stop(self) -> None:
        """The thread ends after the job it is on (a hung read's thread once the read returns, if ever)."""
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args = job
            try:
                future.set_result(fn(self, *args))
            except Exception as exc:
                future.set_exception(exc)


def _read_all(worker: Worker, readers: list[tuple[str, Callable[[float], GpuSample]]], now: float) -> list:
    """Read the GPUs one after the other: [(pci, sample or exception, seconds)]."""
    out = []
    for pci, reader in readers:
        worker.current = pci
        start = time.perf_counter()
        try:
            out.append((pci, reader(now), time.perf_counter() - start))
        except Exception as exc:
            out.append((pci, exc, time.perf_counter() - start))
    worker.current = None
    return out


class GpuWatch:
    name = "gpus"

    def __init__(self, config: GpuConfig, gpus: Callable[[], list[Gpu]], sink: Sink,
                 recorder: FlightRecorder, xid_overrides: Mapping[int, Severity] | None = None,
                 xid_merge: XidMerge | None = None, rules: TelemetryRules | None = None) -> None:
        """`xid_overrides`: `[kernel.xid]`, which NVML's Xid events honour as the kernel log's do. `xid_merge`:
        where the kernel log's Xids are noted, so that NVML's copy of one is not a second event. `rules`: the
        daemon's, which outlive this watch (what is open is theirs to end)."""
        self.config, self.gpus, self.sink, self.recorder = config, gpus, sink, recorder
        self.xid_overrides = xid_overrides or {}
        self.xid_merge = xid_merge or XidMerge()
        self.rules = rules or TelemetryRules(config)
        self._worker = Worker("gpus")
        self._batch: tuple[concurrent.futures.Future, float] | None = None  # the reads out, and when (loop time)
        self._taken = False  # a batch of reads came back or was given up: until then nothing is known to judge
        self._stuck: dict[str, concurrent.futures.Future] = {}  # GPU -> the abandoned read that hangs on it
        self._unresponsive: set[str] = set()
        self._seen: dict[str, Gpu] = {}
        self._missing: set[str] = set()
        self.opened: dict[str, Opened] = {}  # vendor -> what it opened to read its GPUs here
        self._durations: dict[str, float] = {}
        self._readers: dict[str, Callable[[float], GpuSample]] = {}

    def open(self) -> None:
        """Open each registered vendor's readers (NVML when configured and there). Blocking: run off the loop."""
        for vendor in vendors.all_vendors():
            if vendor.open and (opened := vendor.open(self.config)):
                self.opened[vendor.name] = opened
                if opened.gpus is not None:
                    log.info("%s reader on: %d GPU(s)", vendor.name, opened.gpus)

    async def run(self) -> None:
        try:
            await _LIBRARY.run("open", _LIBRARY_DEADLINE, self.open)
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._sample_forever())
                for opened in self.opened.values():
                    if opened.xid_events:
                        tasks.create_task(self._watch_xids(opened))
        finally:  # a reload or a restart builds the next watch, with a worker of its own
            self._worker.stop()

    async def _sample_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._round()
            # the next point of the shared grid, due with the loop's other wake-ups (a round the loop missed while
            # blocked is skipped, not made up: reads handed out back to back would each look overdue)
            tick = next_tick(loop.time(), self.config.interval)
            if self._batch is not None and (deadline := self._batch[1] + self.config.read_deadline) < tick:
                await asyncio.sleep(max(0.0, deadline - loop.time()))  # a deadline shorter than the interval
                self._overdue(loop.time(), time.time())
            await asyncio.sleep(max(0.0, tick - loop.time()))

    def _round(self) -> None:
        """The daemon's round: the reads handed out a round ago, taken, and the next handed out."""
        now = time.time()
        gpus = self._present(now)
        samples = self._take(gpus, asyncio.get_running_loop().time(), now)
        self._hand_out(gpus, now)
        if self._taken or self._batch is None:  # while a watch's first reads are out, no GPU was read: say nothing
            self._judge(samples, gpus, now)

    async def sample_once(self) -> dict[str, GpuSample]:
        """One round read now and waited for (`gpuwarden status`, doctor): the healthy GPUs are read one after the
        other by one worker (eight threads fighting for the GIL cost four times the CPU of the reads). When a read
        misses the deadline, the GPU it was on is left behind with that worker, which is abandoned, and a fresh
        worker reads the others from then on."""
        now = time.time()
        gpus = self._present(now)
        self._hand_out(gpus, now)
        if self._batch is not None:
            await asyncio.wait([asyncio.wrap_future(self._batch[0])], timeout=self.config.read_deadline)
        samples = self._take(gpus, asyncio.get_running_loop().time(), now)
        self._judge(samples, gpus, now)
        return samples

    def _present(self, now: float) -> dict[str, Gpu]:
        """The GPUs here now, each that went missing or came back told, and each hung read that returned."""
        gpus = {g.pci: g for g in self.gpus()}
        self._check_missing(gpus, now)
        for pci, future in list(self._stuck.items()):
            if future.done():  # the hung read came back at last
                del self._stuck[pci]
                self._unresponsive.discard(pci)
                self.sink.resolve(conditions.lost(pci), f"GPU {pci} answers reads again", _UNRESPONSIVE)
        return gpus

    def _hand_out(self, gpus: dict[str, Gpu], now: float) -> None:
        """The next reads of the GPUs not hung, when none are out: queued once the other tasks due now have taken
        their step (a worker reading while the loop still runs hands the GIL to and fro at each read)."""
        if self._batch is None and (readers := [(pci, r) for pci, g in gpus.items()
                                                if pci not in self._stuck and (r := self._reader(g))]):
            loop = asyncio.get_running_loop()
            self._batch = (concurrent.futures.Future(), loop.time())
            loop.call_soon(self._worker.hand, self._batch[0], _read_all, readers, now)

    def _take(self, gpus: dict[str, Gpu], when: float, now: float) -> dict[str, GpuSample]:
        """The outstanding reads' samples of the GPUs still here, once they are all back (at loop time `when`)."""
        if self._batch is None or self._overdue(when, now) or not self._batch[0].done():
            return {}
        future = self._batch[0]
        self._batch, self._taken = None, True
        return {pci: sample for pci, result, seconds in future.result()
                if pci in gpus and (sample := self._finished(pci, result, seconds)) is not None}

    def _overdue(self, when: float, now: float) -> bool:
        """Whether the outstanding reads missed `read_deadline` at loop time `when`: then the worker is abandoned
        with the GPU it hangs on."""
        if self._batch is None or self._batch[0].done() or (took := when - self._batch[1]) < self.config.read_deadline:
            return False
        self._abandon(self._worker.current, self._batch[0], took, now)
        self._taken = True
        return True

    def _judge(self, samples: dict[str, GpuSample], gpus: dict[str, Gpu], now: float) -> None:
        """Export the round and judge each GPU here on its latest reading: one that was not read this round (its
        read failed or hangs) keeps what it last showed, and with no reading at all nothing is judged (not every
        condition a restart took up ended)."""
        latest = {pci: s for pci, s in self.recorder.latest().items() if pci in gpus}
        self._export(samples, latest, gpus)
        if not latest and gpus:
            return
        for change in self.rules.evaluate(latest, now):
            if change.event:
                self.sink.record([change.event])
            else:
                self.sink.resolve(conditions.degraded(change.key), change.message)

    def _abandon(self, pci: str | None, future: concurrent.futures.Future, took: float, now: float) -> None:
        self._worker.stop()
        self._batch, self._worker = None, Worker("gpus")
        if pci is None:
            return
        self._stuck[pci] = future
        self._unresponsive.add(pci)
        self.sink.record([Event("gpu_unresponsive", Severity.CRITICAL,
                                f"reading GPU {pci} has not returned for {took:.1f} s: the driver or the GPU "
                                "hangs (the read is abandoned)", now, gpu=pci,
                                evidence={"read_seconds": round(took, 2)})])
        self.sink.count(families.GPU_READ_ERRORS, pci, "timeout")

    def _reader(self, gpu: Gpu) -> Callable[[float], GpuSample] | None:
        if gpu.pci in self._readers:
            return self._readers[gpu.pci]
        opened = self.opened.get(gpu.vendor)
        if reader := opened and opened.reader(gpu):
            self._readers[gpu.pci] = reader
        return reader

    def _finished(self, pci: str, result, seconds: float) -> GpuSample | None:
        if isinstance(result, Exception):
            log.warning("reading GPU %s failed: %s", pci, result)
            self.sink.count(families.GPU_READ_ERRORS, pci, "error")
            return None
        for state in set(result.problems.values()):
            self.sink.count(families.GPU_READ_ERRORS, pci, state)
        self.recorder.add(result)
        self._durations[pci] = seconds
        return result

    def _check_missing(self, gpus: dict[str, Gpu], now: float) -> None:
        for pci, gpu in gpus.items():
            self._seen[pci] = gpu
            if pci in self._missing:
                self._missing.discard(pci)
                self.sink.resolve(conditions.lost(pci), f"GPU {pci} is back", _MISSING)
        for pci in set(self._seen) - set(gpus) - self._missing:
            self._missing.add(pci)
            self.recorder.forget(pci)
            self._readers.pop(pci, None)
            self.sink.record([Event("gpu_missing", Severity.CRITICAL, f"GPU {pci} ({self._seen[pci].vendor}) "
                                    "disappeared from the PCI bus", now, gpu=pci)])

    def _export(self, samples: dict[str, GpuSample], latest: dict[str, GpuSample], gpus: dict[str, Gpu]) -> None:
        for family, series in series_of(latest).items():
            self.sink.replace_series(family, series)
        up = {(pci, g.vendor, (latest.get(pci) and latest[pci].model) or ""): 1.0 if pci in samples else 0.0
              for pci, g in gpus.items()}
        self.sink.replace_series(families.GPU_READER_UP, up)
        self.sink.replace_series(families.GPU_READ_DURATION,
                                 {(pci,): self._durations[pci] for pci in gpus if pci in self._durations})

    async def _watch_xids(self, opened: Opened) -> None:
        """The Xids a vendor's library reports (NVML's), merged with the kernel log's copies."""
        while True:
            try:
                events = await _LIBRARY.run("xid events", _LIBRARY_DEADLINE, opened.xid_events, 1000)
            except (Busy, TimeoutError):
                await asyncio.sleep(1.0)  # a hung wait still holds its thread: try again once it returns
                continue
            except Exception as exc:
                log.warning("%s Xid events unavailable: %s", opened.library, exc)
                for event in self.xid_merge.due(float("inf")):  # what is held has no other way out
                    self.sink.record([event])
                return
            now = time.monotonic()
            for pci, xid in events:
                severity, meaning = xid_catalog.judge(xid, self.xid_overrides)
                self.xid_merge.nvml(pci, xid, Event("xid", severity, f"{meaning} on {pci} ({opened.library})",
                                                    time.time(), gpu=pci,
                                                    evidence={"xid": xid, "source": opened.library.lower()}), now)
            for event in self.xid_merge.due(now):  # no kernel copy came: the library's is the only word of it
                self.sink.record([event])


SERIES = {  # family -> (extra label, sample fields that fill it)
    families.GPU_POWER: (None, "power_watts"),
    families.GPU_POWER_CAP: (None, "power_cap_watts"),
    families.GPU_FAN: (None, "fan_rpm"),
    families.GPU_BUSY: (None, "busy_ratio"),
    families.GPU_VOLTAGE: (None, "voltage_mv"),
    families.GPU_CLOCK: ("clock", {"sclk": "sclk_hz", "mclk": "mclk_hz"}),
    families.GPU_VRAM: ("kind", {"total": "vram_total_bytes", "used": "vram_used_bytes",
                                 "reserved": "vram_reserved_bytes", "visible_total": "vram_visible_total_bytes"}),
    families.GPU_PCIE_SPEED: ("link", {"current": "pcie_speed_gts", "max": "pcie_max_speed_gts"}),
    families.GPU_PCIE_WIDTH: ("link", {"current": "pcie_width", "max": "pcie_max_width"}),
}


_SCALE = {"voltage_mv": 1e-3, "pcie_speed_gts": 1e9, "pcie_max_speed_gts": 1e9}  # to base units
# SERIES flat, as series_of walks it for every sample of every round: (family, extra label value or None, field,
# scale), in SERIES's order
_PLAN = [(family, extra, attr, _SCALE.get(attr, 1.0)) for family, (label, fields) in SERIES.items()
         for extra, attr in (fields.items() if label else [(None, fields)])]


def series_of(samples: dict[str, GpuSample]) -> dict[families.Family, dict[tuple[str, ...], float]]:
    """Prometheus series for the latest samples, labelled gpu, vendor, model (and the extra label)."""
    out: dict[families.Family, dict[tuple[str, ...], float]] = {family: {} for family in SERIES}
    temperature = out[families.GPU_TEMPERATURE] = {}
    limits = out[families.GPU_TEMPERATURE_LIMIT] = {}
    throttle = out[families.GPU_THROTTLE] = {}
    for s in samples.values():
        base = (s.gpu, s.vendor, s.model or "")
        for family, extra, attr, scale in _PLAN:
            if (value := getattr(s, attr)) is not None:
                out[family][(*base, extra) if extra else base] = float(value) * scale
        for sensor, value in s.temperatures.items():
            temperature[(*base, sensor)] = value
        for sensor, (slowdown, shutdown) in s.temperature_limits.items():
            if slowdown is not None:
                limits[(*base, sensor, "slowdown")] = slowdown
            if shutdown is not None:
                limits[(*base, sensor, "shutdown")] = shutdown
        known = vendor.throttle_reasons if (vendor := vendors.named(s.vendor)) else ()
        for reason in {*known, *s.throttle}:
            throttle[(*base, reason)] = 1.0 if reason in s.throttle else 0.0
    return out


def read_once(config: GpuConfig, gpus: list[Gpu]) -> dict[str, GpuSample]:
    """One fresh reading of `gpus` through the daemon's readers, outside the daemon (status, doctor)."""
    if not gpus:
        return {}

    async def read_all():
        watch = GpuWatch(config, lambda: gpus, NullSink(), FlightRecorder())
        watch.open()
        return await watch.sample_once()

    return asyncio.run(read_all())
