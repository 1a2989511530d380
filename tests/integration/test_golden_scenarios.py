"""The golden pages' scenarios, played by the real daemon (tests/unit/test_golden_alerts.py replays their
recordings into the golden texts).

Each scenario runs the real daemon in this process (inprocess.py) against real parts: a fake engine process on
loopback that stalls or hangs, a kernel log file the daemon follows, a real alert delivery to a loopback
receiver, and a fake GPU sysfs tree (no GPU here: the one thing mocked). What its alerter was handed (the events
as the hub decided and stored them, the resolutions, each at its time) and the alert context the daemon gave it
make the recording. Each test replays its recording through a fresh real alerter and checks that it makes the
very pages the running daemon made: the golden texts are what the daemon sends. With GPUWARDEN_RECORD_GOLDEN=1
the recording is saved (tests/data/golden/scenarios/), then `GPUWARDEN_REGEN_GOLDEN=1 pytest
tests/unit/test_golden_alerts.py` writes the texts, to be read as the person woken by them before committing.
"""

from __future__ import annotations

import asyncio
import os
import time

from helpers import TEST_GPU, free_port, heavy_lock
from inprocess import daemon_in, running

import golden
from fakesysfs import build

RECORD = os.environ.get("GPUWARDEN_RECORD_GOLDEN") == "1"
ENGINE = {"scrape_interval": '"0.5s"', "min_stall": '"2s"', "kill_grace": '"1s"', "gpus": f'["{TEST_GPU}"]'}


def config(tmp_path, receiver, engines: str, extra: str = "", cache: str = "") -> str:
    sysfs = build(tmp_path / "sys", {TEST_GPU: "rdna3"})
    (tmp_path / "kern.log").touch()
    return (f'\n[kernel]\nsource = "file"\nfile = "{tmp_path / "kern.log"}"\n'
            f'[gpu]\nsysfs_root = "{sysfs}"\nnvml = false\n[guard]\nenabled = false\n'
            f'[cache]\ndirs = ["{tmp_path / "cache"}"]\n{cache}'
            f'[alerts]\nhostname = "box1"\ngroup_window = "1s"\n'
            f'urls = ["json://127.0.0.1:{receiver.port}/pager"]\n{engines}\n{extra}')


def engine(name: str, url: str, **settings: str) -> str:
    return (f'[[engine]]\nname = "{name}"\nmetrics_url = "{url}"\n'
            + "".join(f"{k} = {v}\n" for k, v in {**ENGINE, **settings}.items()))


async def until(what: str, check, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        await asyncio.sleep(0.2)


def kinds(recorder: golden.Recorder) -> list[str]:
    return [row["kind"] for call in recorder.calls for row in call.get("submit", ())]


def play(name: str, tmp_path, daemon_config: str, scenario, exporter_port: int | None = None) -> dict:
    """Run `scenario(recorder)` against the real daemon, wait for its pages to settle, then check that the
    recording replays into the same pages, and save it where asked."""
    daemon = daemon_in(tmp_path, daemon_config, exporter_port)

    async def main():
        async with running(daemon):
            recorder = golden.Recorder(daemon.alerter)
            await scenario(recorder, daemon)
            await asyncio.sleep(daemon.alerter.config.group_window + 1.5)  # the last group is sent
            return recorder, time.time()

    with heavy_lock():
        recorder, end = asyncio.run(main())
    recording = recorder.recording(end)
    assert recorder.pages, "the scenario paged nothing"
    assert golden.replay(recording, tmp_path / "replay.db") == recorder.pages  # the replay is the daemon's path
    if RECORD:
        golden.save(name, recording)
    return recording


def test_stall_kill(tmp_path, receiver, fake_engine):
    """A stalled engine (two requests, a spinning process) is killed; nothing supervises it."""
    fake = fake_engine("progress", "--spin")

    async def scenario(recorder, daemon):
        await asyncio.sleep(2)
        fake.set_mode("stall")
        await until("kill", lambda: "engine_killed" in kinds(recorder))

    play("stall_kill", tmp_path, config(tmp_path, receiver, engine("qwen-72b", fake.url)), scenario)


def test_engine_unresponsive(tmp_path, receiver, fake_engine):
    """An engine whose /metrics hangs with requests running: as stuck as a stall, killed."""
    fake = fake_engine("progress")

    async def scenario(recorder, daemon):
        await asyncio.sleep(2)
        fake.set_mode("hang")
        await until("kill", lambda: "engine_killed" in kinds(recorder))

    play("engine_unresponsive", tmp_path, config(tmp_path, receiver, engine(
        "qwen-72b", fake.url, scrape_timeout='"0.3s"', unresponsive_after="2")), scenario)


def test_kill_refused(tmp_path, receiver, fake_engine):
    """A kill budget of one, spent on the engine's first stall; it comes back (its supervisor, played here by
    starting it again), stalls again, and that kill is refused: a person must act."""
    first = fake_engine("stall")
    port = first.port
    made = []

    async def scenario(recorder, daemon):
        await until("the first kill", lambda: "engine_killed" in kinds(recorder))
        await until("the first engine gone", lambda: not first.alive())
        made.append(fake_engine("progress", port=port))
        await until("back", lambda: "engine_back" in kinds(recorder), 60)
        made[0].set_mode("stall")
        await until("the refusal", lambda: "kill_refused" in kinds(recorder))

    play("kill_refused", tmp_path, config(tmp_path, receiver, engine(
        "qwen-72b", first.url, kill_budget="1", target='{ kind = "port" }')), scenario)


def test_engine_not_answering(tmp_path, receiver):
    """A configured engine that nothing serves (not started, or a mistyped port): one page once its bound
    (restart_timeout) has passed since gpuwarden began to watch it."""
    url = f"http://127.0.0.1:{free_port()}/metrics"

    async def scenario(recorder, daemon):
        await until("the page", lambda: "engine_not_answering" in kinds(recorder), 20)
        await asyncio.sleep(3)  # never a second one

    play("engine_not_answering", tmp_path, config(tmp_path, receiver, engine(
        "llama-8b", url, restart_timeout='"4s"')), scenario)


def crash_loop(name: str, tmp_path, receiver, fake_engine, cache_settings: str = "") -> dict:
    """An engine that keeps dying (its processes killed under it twice) is a crash loop; its compile cache holds
    zero-byte files (a write cut by a power loss)."""
    cache = tmp_path / "cache" / "torch_compile_cache"
    cache.mkdir(parents=True)
    for file in ("fx_graph_0.py", "fx_graph_1.py"):
        (cache / file).touch()  # zero bytes
    (cache / "index.json").write_text("{}")
    fake = fake_engine("progress")
    port = fake.port

    async def scenario(recorder, daemon):
        await asyncio.sleep(2)
        fake.kill()
        await until("the first exit", lambda: "engine_exited" in kinds(recorder))
        again = fake_engine("progress", port=port)
        await asyncio.sleep(3)
        again.kill()
        await until("the crash loop", lambda: "engine_crash_loop" in kinds(recorder))
        if not cache_settings:
            await until("the caches moved", lambda: "cache_poisoned" in kinds(recorder))

    return play(name, tmp_path, config(tmp_path, receiver, engine("llama-8b", fake.url, crash_loop_exits="2"),
                                       cache=cache_settings), scenario)


def test_quarantine(tmp_path, receiver, fake_engine):
    """gpuwarden moves the poisoned cache aside: the move names the engine whose crash loop it ends, so it is
    told in that incident (it was an incident of its own)."""
    recording = crash_loop("quarantine", tmp_path, receiver, fake_engine)
    rows = {row["kind"]: row for call in recording["calls"] for row in call.get("submit", ())}
    assert rows["cache_poisoned"]["engine"] == "llama-8b"
    assert rows["cache_poisoned"]["evidence"]["incident"] == rows["engine_crash_loop"]["evidence"]["incident"]


def test_crash_loop(tmp_path, receiver, fake_engine):
    """The same crash loop where the configuration says only to alert (on_crash_loop = "alert"): nothing moves."""
    crash_loop("crash_loop", tmp_path, receiver, fake_engine, 'on_crash_loop = "alert"\n')


def test_stall_alert_only(tmp_path, receiver, fake_engine):
    """on_stall = "alert": the stall is paged, nothing is killed, and it ends by itself, told on its page."""
    fake = fake_engine("progress")

    async def scenario(recorder, daemon):
        await asyncio.sleep(2)
        fake.set_mode("stall")
        await until("the stall", lambda: "engine_stall" in kinds(recorder))
        await asyncio.sleep(3)
        fake.set_mode("progress")
        await until("its end", lambda: any("resolve" in call for call in recorder.calls))

    play("stall_alert_only", tmp_path, config(tmp_path, receiver, engine("qwen-72b", fake.url, on_stall='"alert"')),
         scenario)


def test_kill_not_done(tmp_path, receiver, fake_engine, monkeypatch):
    """Issue 36's failure path: a stalled engine never looked at before, and every look at its processes late
    (the host too slow: the look's own deadline shrunk to nothing, as tests/integration/test_kill_not_done.py
    does); the kill cannot run: "NOT killed", then the kill once a look answers again."""
    from gpuwarden.engine import looks

    fake = fake_engine("progress")
    monkeypatch.setattr(looks, "DEADLINE", 0.0)  # every look is late: none ever answers in time

    async def scenario(recorder, daemon):
        await asyncio.sleep(2)
        fake.set_mode("stall")
        await until("the kill not done", lambda: "kill_not_done" in kinds(recorder))
        await asyncio.sleep(daemon.alerter.config.group_window + 0.5)  # its page out before the kill
        monkeypatch.setattr(looks, "DEADLINE", 10.0)  # the host answers again
        await until("the kill", lambda: "engine_killed" in kinds(recorder))

    play("kill_not_done", tmp_path, config(tmp_path, receiver, engine("qwen-72b", fake.url, canary='"off"')),
         scenario)


class Frozen:
    """A process frozen in a cgroup-v1 freezer cgroup of its own: in state D, as a process stuck in a GPU driver
    is, it survives SIGKILL until it is thawed (then the pending SIGKILL ends it)."""

    ROOT = "/sys/fs/cgroup/freezer"

    def __init__(self, pid: int) -> None:
        from pathlib import Path

        self.dir = Path(self.ROOT) / f"gpuwarden-golden-{os.getpid()}-{pid}"
        self.dir.mkdir()
        (self.dir / "tasks").write_text(str(pid))
        (self.dir / "freezer.state").write_text("FROZEN")

    def thaw(self) -> None:
        (self.dir / "freezer.state").write_text("THAWED")
        for _ in range(100):  # its SIGKILL ends it once it runs: the cgroup empties, and goes
            if not (self.dir / "tasks").read_text().strip():
                break
            time.sleep(0.05)
        self.dir.rmdir()


def test_kill_survivors(tmp_path, receiver, fake_engine):
    """A stalled engine one of whose processes is stuck in the kernel (frozen in a freezer cgroup: state D, as in a
    GPU driver) survives SIGKILL: the page says the kill left it, with its pid."""
    fake = fake_engine("progress")
    frozen = []

    async def scenario(recorder, daemon):
        await asyncio.sleep(2)
        frozen.append(Frozen(fake.pids()[1]))  # its worker process
        fake.set_mode("stall")
        await until("the kill", lambda: "engine_killed" in kinds(recorder), 45)

    try:
        play("kill_survivors", tmp_path, config(tmp_path, receiver, engine("qwen-72b", fake.url)), scenario)
    finally:
        for f in frozen:
            f.thaw()
