"""The golden pages of a restart through Docker, played by the real daemon (as tests/integration/
test_golden_scenarios.py plays the others): a real llama-server in a container (tests/peers/docker.py), frozen
mid-generation with two requests running (a real stall), killed, and started again through the Engine API while
dockerd is stopped (SIGSTOP) for 18 s: the restart is asked again with backoff (issue 36's "restart retried"),
the container starts once dockerd resumes, and a real completion says it is back (docker_restart). Stopped for
longer than restart_timeout, every ask goes unanswered: "restart failed", saying what was tried, and the exact
command with the real container's name (docker_restart_failed). The recordings replay into the pages the running
daemon made; GPUWARDEN_RECORD_GOLDEN=1 saves them."""

from __future__ import annotations

import asyncio
import time

import pytest
from helpers import free_port, http_get
from test_docker import PAUSE, _dockerd
from test_golden_scenarios import config, play, until

from peers.freezer import freeze_inside_a_decode
from peers.load import Load

pytestmark = pytest.mark.root  # dockerd, ptrace, and killing root's container processes


def kinds(recorder) -> list[str]:
    return [row["kind"] for call in recorder.calls for row in call.get("submit", ())]


@pytest.mark.parametrize(("name", "pause", "timeout"), [("docker_restart", PAUSE, 90),
                                                      ("docker_restart_failed", 30.0, 20)])
def test_docker_restart(containers, tmp_path, receiver, name, pause, timeout):
    box = containers()
    port = free_port()
    engine = (f'[[engine]]\nname = "llama-8b"\nmetrics_url = "{box.metrics_url}"\nprofile = "llamacpp"\n'
              'scrape_interval = "1s"\nmin_stall = "5s"\nkill_grace = "2s"\ncanary_timeout = "5s"\n'
              f'on_stall = "restart"\non_unresponsive = "restart"\nrestart_timeout = "{timeout}s"\n'
              f'[engine.target]\nkind = "docker"\ncontainer = "{box.name}"\n')
    dockerd = _dockerd()

    def gauge(name: str) -> float:
        """The daemon's own gauge for the engine, read over loopback (faster than the store)."""
        return max((float(line.split()[-1]) for line in http_get(f"http://127.0.0.1:{port}/metrics").splitlines()
                    if line.startswith(f'{name}{{engine="llama-8b"')), default=0.0)

    async def until_gauge(name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while await asyncio.to_thread(gauge, name) < 1:
            assert time.monotonic() < deadline, f"no {name} within {timeout:.0f} s"
            await asyncio.sleep(0.05)

    async def scenario(recorder, daemon):
        pid = box.engine_pid()
        with Load(box.url, streams=2, max_tokens=300, deadline=120, timeout=120):
            # generating, as the daemon sees it: frozen before, it would be an idle engine whose /metrics hangs
            await until_gauge("gpuwarden_engine_requests_running", 30)
            await asyncio.sleep(2)  # the stall detector learns its pace
            # inside a decode, where /metrics still answers: a stall (frozen elsewhere, /metrics hangs too and no
            # stall gauge ever rises: both recordings once waited out their 60 s for one)
            freezer = await asyncio.to_thread(freeze_inside_a_decode, pid, box.metrics_url)
            try:
                # the moment the stall is said, dockerd stops: the restart that follows meets a paused dockerd
                await until_gauge("gpuwarden_engine_stalled", 60)
                dockerd.suspend()
                paused = time.monotonic()
                try:
                    await until("the retry", lambda: "engine_restart_retrying" in kinds(recorder), 16)
                    await asyncio.sleep(max(0.0, pause - (time.monotonic() - paused)))
                finally:
                    dockerd.resume()
            finally:
                freezer.thaw()
        outcome = "engine_back" if pause < timeout else "engine_restart_failed"
        await until(outcome, lambda: outcome in kinds(recorder), 90)

    recording = play(name, tmp_path, config(tmp_path, receiver, engine), scenario, exporter_port=port)
    said = [row["kind"] for call in recording["calls"] for row in call.get("submit", ())]
    assert said.count("engine_killed") == 1 and said.count("engine_restarting") == 1, said
    assert ("engine_restart_failed" in said) == (pause > timeout) and ("engine_back" in said) == (pause < timeout)
