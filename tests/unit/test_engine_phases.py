"""Engines watched together are looked at each at a phase of its own (issue 40): started together, 32 engines
were looked at together, 32 look threads at once every scrape interval, and the loop waited 127 ms for the GIL.
The watch's clock and sleep are stand-ins here (a schedule, not a speed), its polls return at once."""

import asyncio
import itertools
import types

import pytest

from gpuwarden.config.settings import EngineConfig, EnginesConfig
from gpuwarden.core.model import NullSink
from gpuwarden.engine import watch

INTERVAL = 5.0


class Stop(Exception):
    pass


def test_engines_started_together_look_at_phases_of_their_own(monkeypatch):
    clock = [0.0]
    polls: dict[str, list[float]] = {}

    async def sleep(seconds):
        clock[0] += seconds
        if clock[0] > 3 * INTERVAL:
            raise Stop

    monkeypatch.setattr(watch, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(watch, "asyncio", types.SimpleNamespace(sleep=sleep))
    engines = [EngineConfig(name=f"e{i}", metrics_url=f"http://127.0.0.1:{9000 + i}/metrics",
                            scrape_interval=INTERVAL) for i in range(4)]
    w = watch.EngineWatch(EnginesConfig(discover=False), engines, NullSink(), nvml=False)

    async def poll(state):
        polls.setdefault(state.name, []).append(clock[0])
        return clock[0]
    monkeypatch.setattr(w, "_poll", poll)

    async def each():
        for state in w.engines.values():
            clock[0] = 0.0  # started together
            with pytest.raises(Stop):
                await w._watch(state)
    asyncio.run(each())
    assert all(times[0] == 0.0 for times in polls.values())  # the first look at once, as before
    phases = [round(times[-1] % INTERVAL, 6) for times in polls.values()]
    assert phases[0] == 0.0 and len(set(phases)) == len(engines)  # the first engine's as before; all apart
    assert all(b - a == pytest.approx(INTERVAL) for times in polls.values() for a, b in itertools.pairwise(times[1:]))
