"""A KernelWatch run over given records, as a kernel-clock source (journal, kmsg) delivers them in one batch before
it ends: the events it records (tests of history against live)."""

import asyncio

from gpuwarden.config.settings import KernelConfig
from gpuwarden.core.model import Event, NullSink
from gpuwarden.kernel.sources import Source
from gpuwarden.kernel.watch import KernelWatch


class OneBatch(Source):
    name = "journal"
    kernel_clock = True

    def __init__(self, records):
        super().__init__()
        self.records = records

    async def batches(self):
        yield self.records


class Sink(NullSink):
    def __init__(self):
        self.events = []

    def record(self, events, cursor=None):
        self.events += events
        return list(range(len(events)))


def watched(records, live_since: float | None) -> list[Event]:
    sink = Sink()
    watch = KernelWatch(KernelConfig(source="kmsg", storm_window=0), sink, None, live_since=live_since)

    async def opened():
        return OneBatch(records)
    watch._open = opened
    asyncio.run(watch.run())
    return sink.events
