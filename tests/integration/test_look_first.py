"""Issue 40: each poll looks at the engine's processes first and scrapes once the look is done, so that the look's
thread and the event loop do not hand the GIL back and forth at each of the look's system calls (64 futex calls a
scrape with 32 engines, 7.7 once the scrape waited). A late look holds the scrape back no longer than LOOK_FIRST.

A real daemon in this process watching a real engine process; the look is slowed by a wrapper around the real
one (a sleep before it, in its own thread), and each scrape's start and each look's end are noted."""

from __future__ import annotations

import asyncio
import time
import uuid

from helpers import FakeEngine
from inprocess import daemon_in, running

from gpuwarden.engine import watch
from gpuwarden.engine.looks import Looker


def _watched(tmp_path, corpus, monkeypatch, look_seconds: float, interval: str) -> list[tuple[str, float]]:
    """What happened when: "poll" (one begins), "look begun", "look done", "scrape"."""
    engine = FakeEngine(tmp_path, corpus / "metrics" / "vllm-01.prom", "vllm", "progress")
    noted: list[tuple[str, float]] = []
    real_look, real_scrape, real_poll = Looker._look, watch.EngineWatch._scrape, watch.EngineWatch._poll

    def slow_look(self, *args, **kwargs):
        noted.append(("look begun", time.monotonic()))
        time.sleep(look_seconds)
        try:
            return real_look(self, *args, **kwargs)
        finally:
            noted.append(("look done", time.monotonic()))

    async def scrape(self, state):
        noted.append(("scrape", time.monotonic()))
        return await real_scrape(self, state)

    async def poll(self, state):
        noted.append(("poll", time.monotonic()))
        return await real_poll(self, state)

    monkeypatch.setattr(Looker, "_look", slow_look)
    monkeypatch.setattr(watch.EngineWatch, "_poll", poll)
    monkeypatch.setattr(watch.EngineWatch, "_scrape", scrape)
    # a name of its own: the slow look's thread outlives the daemon, and the pool runs one look per name
    daemon = daemon_in(tmp_path, f'[[engine]]\nname = "look-first-{uuid.uuid4().hex[:8]}"\n'
                                 f'metrics_url = "{engine.url}"\nscrape_interval = "{interval}"\ncanary = "off"\n')

    async def scenario():
        async with running(daemon):
            for _ in range(150):
                if sum(what == "scrape" for what, _ in noted) >= 3:
                    return
                await asyncio.sleep(0.1)
            raise AssertionError(f"fewer than 3 scrapes in 15 s: {noted}")

    try:
        asyncio.run(scenario())
    finally:
        engine.kill()
    return noted


def test_a_scrape_begins_once_its_look_is_done(tmp_path, corpus, monkeypatch):
    noted = _watched(tmp_path, corpus, monkeypatch, look_seconds=0.03, interval="1s")  # well within LOOK_FIRST
    polls = [[what for what, _ in poll] for poll in _polls(noted)]
    assert len(polls) >= 3 and all("look done" in poll[:poll.index("scrape")] for poll in polls), polls


def test_a_late_look_holds_the_scrape_back_no_longer_than_look_first(tmp_path, corpus, monkeypatch):
    # far past LOOK_FIRST (0.1 s), and done before the next poll's look (one look at a time per engine)
    noted = _watched(tmp_path, corpus, monkeypatch, look_seconds=1.0, interval="2s")
    polls = _polls(noted)[1:]  # the first poll waits for its look: its socket was never judged (an earlier rule)
    assert len(polls) >= 2
    for poll in polls:
        (_, begun), (_, at) = poll[0], next(e for e in poll if e[0] == "scrape")
        assert at - begun < watch.LOOK_FIRST + 0.4, f"a scrape waited {at - begun:.2f} s for a late look: {poll}"
        assert [e[0] for e in poll][:3] == ["poll", "look begun", "scrape"], poll  # the look done later, if yet


def _polls(noted: list[tuple[str, float]]) -> list[list[tuple[str, float]]]:
    """What happened, poll by poll, for those that scraped."""
    polls: list[list] = []
    for event in noted:
        if event[0] == "poll":
            polls.append([])
        if polls:
            polls[-1].append(event)
    return [poll for poll in polls if any(what == "scrape" for what, _ in poll)]
