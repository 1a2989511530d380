"""The kernel-watch component: a source, the classifier, and the sink that stores what it finds."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from gpuwarden.config.settings import KernelConfig
from gpuwarden.core import families
from gpuwarden.core.counts import plural
from gpuwarden.core.model import Event, Severity, Sink
from gpuwarden.kernel.classifier import Burst, Classifier
from gpuwarden.kernel.records import KernelRecord
from gpuwarden.kernel.rules import Rule, configured
from gpuwarden.kernel.sources import (
    KMSG,
    FileSource,
    JournalKmsgSource,
    JournalSource,
    KmsgSource,
    Source,
    this_boot,
)

log = logging.getLogger(__name__)

REOPEN = 60.0  # seconds between tries to open a kernel source that cannot be read
CURSOR_EVERY = 1.0  # seconds: a live source moves its position every batch; one SQLite write a second is enough
# The store's key for the kernel log's position, whichever source read it (the journal's, the first): each resumes
# from the others' (a journal cursor, a kmsg position)
POSITION = "journal"


def classifier_for(config: KernelConfig) -> Classifier:
    extra = tuple(
        Rule(f"config_{i}", r.pattern, r.kind, Severity.parse(r.severity), r.vendor, r.meaning or r.pattern,
             r.runbook or r.kind)
        for i, r in enumerate(config.rule)
    )
    return Classifier(configured(config.disable_rules, config.rule_severities()), extra_rules=extra,
                      severity_overrides=config.severity_overrides(),
                      xid_overrides=config.xid_overrides(), storm_window=config.storm_window)


def open_source(config: KernelConfig, cursor: str | None) -> Source:
    """The configured source, resumed after `cursor` (a journal cursor or a kmsg position) where it can be; `auto`
    reads /dev/kmsg live and catches up from the journal when journald holds kernel entries (JournalKmsgSource),
    else /dev/kmsg alone: from a kmsg position of this boot (what the ring lost since counted as an overrun), else
    from its end."""
    choice = config.source
    if choice == "auto":
        if not JournalSource.has_kernel_entries():
            choice = "kmsg"
        else:
            try:
                return JournalKmsgSource(cursor, config.lookback)
            except OSError as exc:  # /dev/kmsg unreadable (dmesg_restrict without CAP_SYSLOG): the journal alone
                log.warning("auto: %s unreadable (%s); reading the journal only", KMSG, exc)
                choice = "journal"
    if choice == "journal":
        return JournalSource(cursor, config.lookback)
    if choice == "file":
        if config.file is None:
            raise ValueError("kernel.source = \"file\" needs kernel.file")
        return FileSource(config.file)
    source = KmsgSource()
    if not source.resumes(cursor, source.open_oldest(), past_a_gap=True):
        source.start()
    return source


class KernelWatchFailed(Exception):
    """The watch failed on a batch of lines (a bug): the supervisor builds it again, after them."""


class KernelWatch:
    name = "kernel"

    def __init__(self, config: KernelConfig, sink: Sink, cursor: str | None, live_since: float | None = None,
                 gpus_behind: Callable[[str], list[str]] = lambda port: []) -> None:
        """`cursor`: where to resume (a journal cursor, a kmsg position); it follows the lines read, so that a watch
        built again after this one (a reload, a restart) starts where this one stopped. `live_since`: the daemon's
        start on the kernel log's clock (printk's: kernel/clock.py); a line logged before it is history. None: every
        line is live. `gpus_behind`: the GPUs below a PCIe port (a
        look-up in what the GPU inventory found, never sysfs on the loop)."""
        self.sink, self.config, self.cursor, self.gpus_behind = sink, config, cursor, gpus_behind
        self.classifier = classifier_for(config)
        self.source: Source | None = None
        self.unavailable: str | None = None  # why no kernel source can be read now
        self.live_since = live_since
        self.boot = this_boot()
        self._counted = (0, 0, 0)  # the source's lines, malformed lines and overruns counted so far
        self._saved_at = 0.0  # when the position was last saved (time.time())
        self.read = False  # whether `cursor` is a line this watch read (a position of its own, saved at its end)

    @property
    def watched_kernel_log(self) -> bool:
        """Whether it was reading the kernel log (a source with kernel time, opened): what was logged from its
        start on was its to read, and the watch built after it goes on from there."""
        return self.source is not None and self.source.kernel_clock

    @property
    def status(self) -> str:
        return self.source.label if self.source else f"unavailable ({self.unavailable})" if self.unavailable \
            else "opening"

    def state(self) -> dict:
        """Its state for the registry (core/registry.py): whether a source is read, and which or why not."""
        return {"up": self.unavailable is None, "detail": self.status}

    async def _open(self) -> Source:
        """The source, once it can be read. One that is absent or forbidden (no /dev/kmsg in a container, no
        kernel entries in the journal, no CAP_SYSLOG) is reported once and tried again every REOPEN seconds:
        the daemon runs on, degraded, and keeps its watchdog (this is no wedge a restart could cure)."""
        while True:
            try:
                source = open_source(self.config, self.cursor)
                self.sink.metric(families.SOURCE_UP, 1, "kernel")
                return source
            except (OSError, ValueError, ImportError) as exc:
                self.sink.metric(families.SOURCE_UP, 0, "kernel")
                first = self.unavailable is None
                self.unavailable = f"{self.config.source}: {exc}"
                if first:
                    self.sink.record([Event(
                        "watchdog_error", Severity.WARNING, f"no kernel log can be read ({self.unavailable}): GPU "
                        f"faults in it are not watched; trying again every {REOPEN:.0f} s", time.time(),
                        evidence={"component": "kernel", "error": self.unavailable})])
                    log.warning("kernel source unavailable (%s); trying again every %.0f s", self.unavailable,
                                REOPEN)
            await asyncio.sleep(REOPEN)

    async def run(self) -> None:
        self.source = source = await self._open()
        if self.unavailable:
            log.info("kernel source readable again after: %s", self.unavailable)
            self.unavailable = None
        log.info("kernel source: %s", source.label)
        self.classifier.live_since = self.live_since if source.kernel_clock else None
        try:
            async for batch, ended in _then_end(source.batches()):
                try:
                    self._handle(batch, ended)
                except Exception as exc:
                    # A batch that breaks the watch is left behind, its lines said lost: read again by the watch
                    # built next, it would break that one too, and a line a user can make the kernel print would
                    # blind the watch for good
                    if self.source.kernel_clock:
                        self.cursor = next((r.cursor for r in reversed(batch) if r.cursor), self.cursor)
                    raise KernelWatchFailed(f"{plural(len(batch), 'kernel line')} left unread after "
                                            f"{type(exc).__name__}: {exc}") from exc
        except asyncio.CancelledError:
            # Stopped (a reload, a restart, the daemon's stop): what the classifier holds is recorded and the
            # position saved now: the watch built next resumes after the last line read, and reads none again
            self._handle([], True, save=True)
            raise
        finally:
            source.close()

    def _handle(self, batch: list[KernelRecord], ended: bool, save: bool = False) -> None:
        """One batch: classified, its events recorded with the position after it (`save`: even within
        CURSOR_EVERY of the last), the counters moved."""
        sink, source, now = self.sink, self.source, time.time()
        bursts = [burst for _, started in self.classifier.feed_all(batch, now) for burst in started]
        sink.kernel_lines(now, [r.text for r in batch])
        flushed = self.classifier.flush(now, everything=ended)
        bursts += flushed.new
        deadline = self.classifier.deadline()  # a held line: wake up when it is due, not at the tick
        source.wake_at = None if deadline is None else time.monotonic() + max(0.0, deadline - now)
        lines, malformed, overruns = self._counted
        if source.overruns > overruns:
            lost = source.overruns - overruns
            sink.count(families.KMSG_OVERRUNS, by=lost)
            bursts.append(Burst(_overrun_event(now, lost), now, now, now))
        for burst in bursts:
            burst.event = behind_port(burst.event, self.gpus_behind)
            if self._is_history(burst):
                burst.event = burst.event.as_history(self._logged_at(burst))
        # a position in the kernel log (a file's journal-JSON lines carry cursors of another journal)
        if source.kernel_clock and (read := next((r.cursor for r in reversed(batch) if r.cursor), None)):
            self.cursor, self.read = read, True
        events = [b.event for b in bursts]
        # a position alone is saved at most every CURSOR_EVERY; with events, always; at the end, if it moved
        cursor = self.cursor if self.read and (batch or save) else None
        if cursor and not (events or save) and now - self._saved_at < CURSOR_EVERY:
            cursor = None
        if events or cursor:
            self._saved_at = now if cursor else self._saved_at
            refs = sink.record(events, (POSITION, cursor) if cursor else None)
            for burst, ref in zip(bursts, refs, strict=True):
                burst.ref = ref
        for burst in flushed.grown:
            if burst.ref is not None:
                sink.set_count(burst.ref, burst.final)
        sink.count(families.KERNEL_LINES, source.name, by=source.lines - lines)
        sink.count(families.KERNEL_LINES_MALFORMED, source.name, by=source.malformed - malformed)
        self._counted = source.lines, source.malformed, source.overruns
        sink.polled(f"kernel_{source.name}")

    def _logged_at(self, burst: Burst) -> float | None:
        """When a history line was logged, on the wall clock: the journal's own time of its entry, or, for a kmsg
        line of this boot, its kernel time, printk's, which runs close to CLOCK_MONOTONIC (kernel/clock.py: 0.27 s
        apart after 21 hours), as `dmesg -T` counts. None where it cannot be told (an earlier boot's line without
        its journal time, a file's)."""
        if burst.wall is not None:
            return burst.wall
        if not self.source.kernel_clock or (burst.boot and burst.boot != self.boot):
            return None
        return time.time() - (time.monotonic() - burst.first)

    def _is_history(self, burst: Burst) -> bool:
        """Judged by the line's own kernel time, not by when it was read. kmsg and journal records carry the
        kernel's monotonic time (a line of an earlier boot is history whatever its time: the burst carries its
        line's boot, a line the classifier held too); a file's lines are read from its end, so they are new."""
        if burst.boot and burst.boot != self.boot:
            return True
        return self.live_since is not None and self.source.kernel_clock and burst.first < self.live_since


async def _then_end(batches: AsyncIterator[list[KernelRecord]]) -> AsyncIterator[tuple[list[KernelRecord], bool]]:
    """The source's batches, then an empty one when it ends: what the classifier still holds (a fault line
    waiting for its process line, an open oops report) is recorded, not lost."""
    async for batch in batches:
        yield batch, False
    yield [], True


def behind_port(event: Event, gpus_behind: Callable[[str], list[str]]) -> Event:
    """A line that names a PCIe port rather than a GPU (AER: `pcieport 0000:00:1c.4`) is about the GPUs behind
    that port: the event names them (`gpu` when there is one, and the GPU the log itself named stays)."""
    port = event.evidence.get("pci")
    if not port or not (gpus := gpus_behind(port)):
        return event
    return replace(event, gpu=event.gpu or (gpus[0] if len(gpus) == 1 else None),
                   message=f"{event.message} (GPU {', '.join(gpus)} behind it)",
                   evidence={**event.evidence, "gpus_behind": gpus})


def _overrun_event(now: float, lost: int) -> Event:
    return Event(kind="kmsg_overrun", severity=Severity.WARNING, time=now,
                 message=f"/dev/kmsg overwrote records before gpuwarden read them ({plural(lost, 'overrun')}); "
                         "kernel messages were lost", evidence={"overruns": lost})
