"""Issue 36: a decided kill is done, or said undone. A look at the engine's processes that misses its deadline (the
host too slow: made here by the look's own deadline shrunk to nothing, in this process's daemon; the engine, the
daemon, its store and its kill are real) for a stalled engine never looked at before: before, the kill ran on
nothing, one log line said so, and nothing followed. Now a critical kill_not_done with the reason, then the kill
at a later look once a look answers; the pages, through the real alert path, never say "killed" before it is."""

from __future__ import annotations

import asyncio

from helpers import FakeEngine, Receiver
from inprocess import daemon_in, running

from gpuwarden.engine import looks
from gpuwarden.store.sqlite import Store


def test_a_late_look_for_a_never_seen_stalled_engine_is_not_killed_said_then_killed(tmp_path, corpus, monkeypatch):
    engine = FakeEngine(tmp_path, corpus / "metrics" / "vllm-01.prom", "vllm", "progress")
    receiver = Receiver().start()
    try:
        daemon = daemon_in(tmp_path, f'[[engine]]\nname = "late"\nmetrics_url = "{engine.url}"\n'
                                     'scrape_interval = "0.5s"\nmin_stall = "2s"\nkill_grace = "1s"\n'
                                     'on_stall = "kill"\ncanary = "off"\n'
                                     '[alerts]\ngroup_window = "100ms"\nretry_initial = "200ms"\nhostname = "box"\n'
                                     f'urls = ["json://127.0.0.1:{receiver.port}/hook"]\n')
        monkeypatch.setattr(looks, "DEADLINE", 0.0)  # every look is late: none ever answers in time
        store = Store(tmp_path / "gpuwarden.db")

        def received() -> list[str]:
            return [b["title"] for b in receiver.json_bodies("/hook")]

        def events(kind: str) -> list[dict]:
            return [e for e in store.events() if e["kind"] == kind]

        async def until(kind: str, timeout: float) -> dict:
            for _ in range(int(timeout / 0.1)):
                if found := events(kind):
                    return found[0]
                await asyncio.sleep(0.1)
            raise AssertionError(f"no {kind} event within {timeout} s: {[e['kind'] for e in store.events()]}")

        async def scenario() -> tuple[dict, dict]:
            async with running(daemon):
                await asyncio.sleep(1.5)  # it progresses: the stall detector learns its pace
                engine.set_mode("stall")
                not_done = await until("kill_not_done", 30)
                assert engine.alive() and not events("engine_killed")
                monkeypatch.setattr(looks, "DEADLINE", 10.0)  # the host answers again
                killed = await until("engine_killed", 15)
                for _ in range(300):  # its page goes out while the daemon runs
                    if any(t.startswith("box: engine late killed") for t in received()):
                        break
                    await asyncio.sleep(0.1)
                return not_done, killed

        not_done, killed = asyncio.run(scenario())
        assert not_done["severity"] == "critical"
        assert not_done["message"].startswith("late NOT killed: none of its processes was found: the look at its "
                                              "processes missed its 0 s deadline (no earlier look: it was never "
                                              "seen) — act by hand"), not_done["message"]
        assert not_done["evidence"]["retrying"] is True
        assert "killed late: 2 processes" in killed["message"]
        assert not engine.alive()
        assert [e["kind"] for e in store.events() if e["kind"] in ("kill_not_done", "engine_killed")] == \
            ["kill_not_done", "engine_killed"]  # the retries said nothing more: one page, then the outcome
        pages = [b for b in receiver.json_bodies("/hook") if b["title"].startswith("box: engine late")]
        titles = [b["title"] for b in pages]
        first = next(i for i, t in enumerate(titles) if "NOT killed" in t)
        assert titles[first].startswith("box: engine late NOT killed: none of its processes was found"), titles
        assert all("killed" not in t and "killed" not in b["message"].replace("NOT killed", "")
                   for t, b in zip(titles[:first], pages[:first], strict=True)), pages[:first]
        assert "gpuwarden killed it" not in " ".join(b["message"] for b in pages[:first + 1])
        assert any(t.startswith("box: engine late killed") for t in titles[first + 1:]), titles
    finally:
        engine.kill()
        receiver.stop()
