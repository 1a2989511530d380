"""One component contract and one registry (issue 35; gpud's components registry and LastHealthStates): each
component that has a state to show reports it itself, and the status page, /status.json and `gpuwarden status`
(all of them hub/snapshot.py's gather) read the registry, never a component's insides."""

import ast
import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

from gpuwarden.config.settings import parse
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.core.registry import Registry
from gpuwarden.engine.watch import EngineWatch
from gpuwarden.gpu.inventory import GpuInventory
from gpuwarden.gpu.recorder import FlightRecorder
from gpuwarden.hub import snapshot
from gpuwarden.hub.queue import Outbox

SNAPSHOT = Path(snapshot.__file__)


class Says:
    """A component that reports the state it is given (a stand-in for one the test does not run)."""

    def __init__(self, state: dict) -> None:
        self.said = state

    def state(self) -> dict:
        return self.said


def parts(registry: Registry, tmp_path) -> SimpleNamespace:
    """What snapshot.gather reads (daemon.Status's parts), with no component of its own but the registry's."""
    return SimpleNamespace(registry=registry, metrics=SelfMetrics(), config=parse(""), started=time.monotonic(),
                           summary=lambda: "a summary", health=SimpleNamespace(loop_lag=lambda: 0.0),
                           store_health=SimpleNamespace(error=None), recorder=FlightRecorder(),
                           inventory=GpuInventory(tmp_path), hub=SimpleNamespace(incidents=SimpleNamespace(open={})))


def test_the_snapshot_shows_what_each_component_says_of_itself(tmp_path):
    registry = Registry()
    row = {"name": "chat", "state": "stalled", "running": 3}
    registry.register("engines", Says({"engines": [row]}))
    registry.register("kernel", Says({"up": False, "detail": "unavailable (kmsg: no such file)"}))
    registry.register("uevents", Says({"detail": "netlink"}))
    snap = snapshot.gather(parts(registry, tmp_path))
    assert snap["engines"] == [row]
    sources = {s["name"]: s for s in snap["sources"]}
    assert sources["kernel"]["up"] is False and sources["kernel"]["detail"] == "unavailable (kmsg: no such file)"


def test_a_component_not_registered_yet_is_not_started(tmp_path):
    snap = snapshot.gather(parts(Registry(), tmp_path))
    assert snap["engines"] == []
    assert {s["name"]: s["detail"] for s in snap["sources"]}["kernel"] == "not started"


def test_one_built_anew_takes_its_name_s_place():
    registry = Registry()
    registry.register("engines", Says({"engines": []}))
    registry.register("engines", Says({"engines": [{"name": "after a reload"}]}))  # a reload's new watch
    assert registry.states() == {"engines": {"engines": [{"name": "after a reload"}]}}


def test_the_engine_watch_reports_its_engines_itself():
    config = parse('[[engine]]\nname = "chat"\nmetrics_url = "http://user:secret@127.0.0.1:9/metrics"\n')

    async def state() -> dict:
        watch = EngineWatch(config.engines, config.engine, Outbox("engines", asyncio.Queue(), SelfMetrics()))
        return watch.state()

    [row] = asyncio.run(state())["engines"]
    assert row["name"] == "chat" and row["state"] == "starting" and "secret" not in row["url"]


def test_the_snapshot_reaches_into_no_component():
    """The old snapshot read `engines.engines[...].lifecycle.detector` and `current.kernel.unavailable`."""
    reached = {node.attr for node in ast.walk(ast.parse(SNAPSHOT.read_text())) if isinstance(node, ast.Attribute)}
    assert reached.isdisjoint({"lifecycle", "detector", "current", "engines", "unavailable", "kernel"})
