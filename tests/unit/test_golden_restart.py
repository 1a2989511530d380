"""Golden pages for the restart's failure paths (issue 36): a supervisor that did not start the engine when asked
(restart retried, then back), and one that never did within restart_timeout (restart failed). The restart's
events are made by the real actuator asking a real supervisor through the Engine API client (act/restart.py,
engine/dockerapi.py): a Docker socket that is not there, so every ask fails at once, as it does on a box whose
dockerd is gone. restart_timeout is the default 600 s, the kill dated 597 s back so that the deadline comes in 3 s
(an ask, a pause of 1 s, an ask, then the pause of 2 s that ends at the deadline). The stall, the kill and the
back are test_golden_alerts.py's, and the pages go through the same storm control and composer as there.
Regenerate as there (GPUWARDEN_REGEN_GOLDEN=1) and read every changed file as the person woken by it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from functools import cache

import pytest
from test_golden_alerts import CTX, GOLDEN, GPU0, KILLED, REGEN, STALL_RESTART, T0, I, ev, messages

from gpuwarden.act.actuator import Actuator
from gpuwarden.alert.context import Runs
from gpuwarden.config.settings import parse
from gpuwarden.core.model import NullSink

SOCKET = "/run/gpuwarden-golden-no-dockerd/docker.sock"  # never made: no Docker daemon answers there
CONFIG = f"""
[[engine]]
name = "qwen-72b"
metrics_url = "http://127.0.0.1:8000/metrics"
on_stall = "restart"
[engine.target]
kind = "docker"
container = "qwen-72b"
docker_socket = "{SOCKET}"
"""


HEADER = ("# the restart's events made by the real actuator asking a Docker daemon that is not there; the stall, "
          "the kill and the back hand-built: a real dockerd runs only in step 2 (tests/peers/docker.py)\n\n")
# here qwen-72b runs in the Docker container of CONFIG: the pages name it, never test_golden_alerts' unit
DOCKER_CTX = replace(CTX, runs={**CTX.runs, "qwen-72b": Runs(container="qwen-72b")})


class Recorded(NullSink):
    def __init__(self):
        self.events = []

    def record(self, events, cursor=None):
        self.events += events
        return super().record(events, cursor)


class Engines:
    def restart_failed(self, name):
        return True  # its lifecycle had not said it first


@cache
def restart_events(deadline_in: float) -> tuple:
    """The actuator's own restart of qwen-72b after its kill, `deadline_in` s before restart_timeout is spent."""
    from gpuwarden.engine.targets import KillTarget

    cfg = parse(CONFIG).engine[0]
    sink = Recorded()
    actuator = Actuator(sink, Engines(), None)
    target = KillTarget([], [], GPU0, cfg)
    asyncio.run(actuator._restart("qwen-72b", target, time.monotonic() - cfg.restart_timeout + deadline_in))
    return tuple(sink.events)


def at(seconds: float, event):
    """A real event, dated as the story goes (its text is as the code made it)."""
    return seconds, replace(event, time=T0 + seconds, evidence={**event.evidence,
                                                                "incident": "20261204-031207-engine_stall"})


def situation(name: str) -> list:
    restarting, retrying, *failed = restart_events(3.0)
    story = [STALL_RESTART, KILLED, at(4, restarting), at(5, retrying)]
    if name == "restart_retried":
        return [*story, ev(71, "engine_back", I, "qwen-72b back: first completion 69 s after the kill",
                           engine="qwen-72b", gpu=GPU0, evidence={"seconds_since_kill": 69.3,
                                                                  "canary": {"outcome": "ok", "seconds": 0.4}})]
    return [*story, at(602, failed[0])]


def test_the_real_restart_retries_then_fails_saying_what_it_tried():
    restarting, retrying, failed = restart_events(3.0)
    assert [e.kind for e in (restarting, retrying, failed)] == [
        "engine_restarting", "engine_restart_retrying", "engine_restart_failed"]
    assert retrying.evidence["command"] == failed.evidence["command"] == "docker start qwen-72b"
    assert failed.message == (
        "qwen-72b could not be started again within restart_timeout (600 s after the kill): its Docker container "
        "qwen-72b was asked 2 times (`docker start qwen-72b`) and did not start it; the last answer: no Docker "
        f"daemon: {SOCKET} does not exist; gpuwarden will not restart it again")


@pytest.mark.parametrize("name", ["restart_retried", "restart_not_started"])
@pytest.mark.parametrize("suffix", [".txt", ".md"])
def test_golden_restart(name, suffix):
    parts = []
    for n, m in enumerate(messages(situation(name), DOCKER_CTX), 1):
        parts.append(f"===== message {n} ({'all-clear, ' if m.resolved else ''}routed as {m.severity}) =====\n"
                     f"{m.title}\n\n" + (m.body if suffix == ".md" else m.text))
    text = HEADER + "\n\n".join(parts) + "\n"
    last = parts[-1]  # back, or the failure: never a hedge, a placeholder or a reason that did not happen
    for false in ("<container>", "<unit>", "did not come back", "never completed a request"):
        assert false not in last, false
    assert name == "restart_retried" or "Nothing to do" not in last
    path = GOLDEN / f"{name}{suffix}"
    if REGEN:
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run with GPUWARDEN_REGEN_GOLDEN=1 and read it"
    assert text == path.read_text(), f"{path} differs (a deliberate change: GPUWARDEN_REGEN_GOLDEN=1, then read it)"
