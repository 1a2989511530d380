"""Target resolution and the killer's safety rules, on real processes."""

import asyncio
import contextlib
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
from helpers import wait_for

from gpuwarden.act.actuator import Actuator
from gpuwarden.act.killer import kill
from gpuwarden.config.settings import CacheConfig, parse
from gpuwarden.core import policy
from gpuwarden.core.model import Event, NullSink, Severity
from gpuwarden.engine.lifecycle import Judged, Look, Stalled
from gpuwarden.engine.metrics import EngineSample
from gpuwarden.engine.processes import TargetSpec, Tracker, gpus_in_use, is_killable, resolve
from gpuwarden.engine.targets import KillTarget, Refused, refusal
from gpuwarden.engine.watch import EngineWatch

ME = os.getuid()

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


@contextlib.contextmanager
def sleeping():
    """A process named for its test alone (`.name`, a random part): tests beside it run sleepers too."""
    name = f"gpuwarden-test-sleeper-{uuid.uuid4().hex}"
    proc = subprocess.Popen([*SLEEPER, name], start_new_session=True)
    proc.name = name
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def sleeper():
    with sleeping() as proc:
        yield proc


def test_pidfile_and_cmdline_targets(tmp_path, sleeper):
    """The engine's user is given (uid): no socket serves a metrics_url here. tests/security holds the attacks."""
    (tmp_path / "engine.pid").write_text(f"{sleeper.pid}\n")
    found = resolve(TargetSpec("pidfile", pidfile=tmp_path / "engine.pid", uid=ME))
    assert [p.pid for p in found.roots] == [sleeper.pid] and not found.refused
    missing = resolve(TargetSpec("pidfile", pidfile=tmp_path / "missing.pid", uid=ME))
    assert missing.roots == [] and "No such file" in missing.refused[0]
    with sleeping():  # another test's, beside this one: its pattern is not this one's
        assert [p.pid for p in resolve(TargetSpec("cmdline", pattern=sleeper.name, uid=ME)).roots] \
            == [sleeper.pid]


def test_never_pid_1_itself_or_its_ancestors(sleeper):
    me = psutil.Process()
    protected = [psutil.Process(1), me, *me.parents()]
    assert not any(is_killable(p) for p in protected)
    report = kill([*protected, psutil.Process(sleeper.pid)], grace=5)
    assert [entry.split()[0] for entry in report.terminated] == [str(sleeper.pid)]
    assert me.is_running()


@pytest.mark.root
def test_cgroup_target_kills_every_process_in_the_cgroup(sleeper):
    base = Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified/cgroup.procs").exists() \
        else Path("/sys/fs/cgroup")
    group = base / f"gpuwarden-test-{uuid.uuid4().hex}"
    group.mkdir()
    try:
        other = subprocess.Popen(SLEEPER)
        for pid in (sleeper.pid, other.pid):
            (group / "cgroup.procs").write_text(str(pid))
        found = resolve(TargetSpec("cgroup", cgroup=group, uid=ME))
        assert sorted(p.pid for p in found.roots) == sorted([sleeper.pid, other.pid])
        report = kill(Tracker().refresh(found), grace=5)
        assert report.count == 2
        other.wait(5)
    finally:
        group.rmdir()


def test_gpus_from_the_device_files_a_process_holds(tmp_path):
    """No GPU here: a /proc/<pid>/fd with links to DRM and NVIDIA nodes and the sysfs and procfs entries that
    map them to PCI addresses are built by hand, as the kernel lays them out."""
    proc, sys_root = tmp_path / "proc", tmp_path / "sys"
    fd = proc / "4242" / "fd"
    fd.mkdir(parents=True)
    os.symlink("/dev/dri/renderD129", fd / "5")
    os.symlink("/dev/nvidia1", fd / "6")
    os.symlink("/dev/kfd", fd / "7")
    os.symlink("/tmp/model.safetensors", fd / "8")
    pci_dev = sys_root / "devices/pci0000:80/0000:80:01.0/0000:83:00.0"
    pci_dev.mkdir(parents=True)
    (sys_root / "class/drm/renderD129").mkdir(parents=True)
    os.symlink(pci_dev, sys_root / "class/drm/renderD129/device")
    info = proc / "driver/nvidia/gpus/0000:41:00.0"
    info.mkdir(parents=True)
    (info / "information").write_text("Model: \t\t NVIDIA H200\nDevice Minor: \t 1\nBus Location: \t 0000:41:00.0\n")

    class P:
        pid = 4242

    assert gpus_in_use([P()], proc, sys_root) == {"0000:83:00.0", "0000:41:00.0"}
    only_kfd = proc / "77" / "fd"
    only_kfd.mkdir(parents=True)
    os.symlink("/dev/kfd", only_kfd / "3")
    P.pid = 77
    assert gpus_in_use([P()], proc, sys_root) is None  # /dev/kfd alone does not say which GPU: all of them


def _watch(tmp_path, pid: int, sink=None, **settings) -> EngineWatch:
    (tmp_path / "engine.pid").write_text(f"{pid}\n")
    opts = "".join(f"{k} = {v}\n" for k, v in settings.items())
    cfg = parse(f'[[engine]]\nname = "e"\nmetrics_url = "http://127.0.0.1:9/metrics"\n{opts}'
                f'[engine.target]\nkind = "pidfile"\npidfile = "{tmp_path / "engine.pid"}"\nuser = "{ME}"\n')
    return EngineWatch(cfg.engines, cfg.engine, sink or NullSink(), nvml=False)


def test_take_tells_the_lifecycle_of_a_kill_only_when_it_goes_ahead(tmp_path, sleeper):
    """The actuator's one call before a kill: a fresh look, judged, and the lifecycle told before any signal
    (else the processes going would be an exit) — but not for a refused target nor a dry run."""
    watch = _watch(tmp_path, sleeper.pid)
    life = watch.engines["e"].lifecycle
    dry = asyncio.run(watch.take("e", restart=True, dry_run=True))
    assert isinstance(dry, KillTarget) and [p.pid for p in dry.procs] == [sleeper.pid] and life.kills == ()
    real = asyncio.run(watch.take("e", restart=True, dry_run=False))
    assert [p.pid for p in real.procs] == [sleeper.pid] and len(life.kills) == 1 and life.phase == "down"
    assert sleeper.poll() is None  # the watch only hands the target over: the actuator kills
    assert asyncio.run(watch.take("nobody", restart=False, dry_run=False)) is None

    tree = subprocess.Popen([*SLEEPER[:2], "import subprocess, time; subprocess.Popen(['sleep', '600']); "
                             "time.sleep(600)"], start_new_session=True)
    try:  # a parent and its child: two processes, one allowed
        wait_for(lambda: len(psutil.Process(tree.pid).children()) == 1, 10, what="the child")
        too_many = _watch(tmp_path, tree.pid, max_kill_processes=1)
        refused = asyncio.run(too_many.take("e", restart=False, dry_run=False))
        assert isinstance(refused, Refused) and "2 processes, more than max_kill_processes (1)" in refused.reason
        assert too_many.engines["e"].lifecycle.kills == () and too_many.engines["e"].lifecycle.phase == "watching"
    finally:
        os.killpg(tree.pid, 9)
        tree.wait()

    not_its_own = _watch(tmp_path, 1)  # pid 1 is never the engine's
    refused = asyncio.run(not_its_own.take("e", restart=False, dry_run=False))
    assert isinstance(refused, Refused) and refused.reason.startswith("its target was refused")
    assert not_its_own.engines["e"].lifecycle.kills == ()


def test_the_target_judgement():
    assert refusal(2, [], 512) is None
    assert refusal(0, ["pid 1: not the engine's"], 512) == "its target was refused (pid 1: not the engine's)"
    assert refusal(1, ["pid 1: not the engine's"], 512) is None  # the ones it may kill, it kills
    assert refusal(600, [], 512) == "its target resolves to 600 processes, more than max_kill_processes (512)"


class Recorded(NullSink):
    def __init__(self) -> None:
        self.events: list = []

    def record(self, events, cursor=None):
        self.events += events
        return super().record(events, cursor)


class NoTake:
    """The actuator's port, as a stall's kill must leave it: never asked (the target came with the stall)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def take(self, name, restart, dry_run):
        self.asked.append(name)
        raise AssertionError("a stall's kill asked the engine side for a look again")


def test_a_stalls_kill_takes_the_target_its_report_carried_and_asks_nothing_back(tmp_path, sleeper):
    """Walk 2: the engine watch judges the target on its own look (a real process, found by its pidfile), the
    view it reports carries it, the policy's Kill carries it on, and the actuator kills that real process without
    a call back into the engine side (the port here fails the test if it is called)."""
    watch = _watch(tmp_path, sleeper.pid, kill_grace=1)
    state = watch.engines["e"]
    assert asyncio.run(watch.inspect(state))
    view = state.view(state.target())
    [kill_] = policy.decide(Event("engine_stall", Severity.CRITICAL, "stalled", 0.0, engine="e"),
                            policy.Situation([view], frozenset(), 1000.0))
    assert isinstance(kill_, policy.Kill) and [p.pid for p in kill_.target.procs] == [sleeper.pid]
    sink, port = Recorded(), NoTake()

    async def scenario():
        actuator = Actuator(sink, port, CacheConfig(dirs=[]))
        actuator.execute(kill_, Event("engine_stall", Severity.CRITICAL, "stalled", 0.0, engine="e"))
        await asyncio.gather(*actuator._tasks)

    asyncio.run(scenario())
    assert port.asked == [] and sleeper.wait(10) is not None
    [killed] = sink.events
    assert killed.kind == "engine_killed" and killed.evidence["terminated"][0].split()[0] == str(sleeper.pid)


def test_a_target_judged_on_its_look_is_refused_as_take_would_refuse_it(tmp_path):
    not_its_own = _watch(tmp_path, 1)  # pid 1 is never the engine's
    state = not_its_own.engines["e"]
    asyncio.run(not_its_own.inspect(state))
    assert isinstance(state.target(), Refused) and state.target().reason.startswith("its target was refused")


def test_the_watch_learns_its_stalls_kill_from_the_outcome_and_says_a_held_exit_when_there_was_none(tmp_path,
                                                                                                     sleeper):
    """Walk 3's end: the hub hands the engine watch an outcome. The stalled engine's processes went before it came
    (held: no engine_exited yet); a refusal or a dry run makes that an exit, said then; a real kill makes it ours,
    counted once, timed from the stall (the lifecycle's own clock is passed in: these looks are made up)."""
    busy = EngineSample("vllm", 4, 0.0, 100, 100, False, None)
    outcomes = {"kill_refused": {}, "engine_killed": {"dry_run": True, "restart": False}}
    for kind, evidence in [*outcomes.items(), ("engine_killed", {"dry_run": False, "restart": False})]:
        sink = Recorded()
        watch = _watch(tmp_path, sleeper.pid, sink)  # on_stall = "kill", the default
        life = watch.engines["e"].lifecycle
        instance = frozenset({(sleeper.pid, 1.0)})
        life.observe(Look(0.0, busy, instance))
        assert any(isinstance(t, Stalled) for t in life.observe(Look(10_000.0, busy, instance)))
        assert [t for t in life.observe(Look(10_001.0, None, frozenset())) if not isinstance(t, Judged)] == []
        watch.learn(Event(kind, Severity.CRITICAL, kind, 0.0, engine="e", evidence=evidence))
        if evidence.get("dry_run") is False:
            assert sink.events == [] and life.kills == (10_000.0,)
        else:
            assert [e.kind for e in sink.events] == ["engine_exited"] and life.kills == ()


def test_a_stall_decided_without_a_kill_tells_the_watch_at_once_that_no_outcome_will_come(tmp_path, sleeper):
    """Its processes went while the stall's decision was on its way: decided with a kill (the hub tells the watch
    nothing), the exit stays held for the kill's outcome; decided without one (alert only, a refusal), the hub
    hands the watch the stall and it is an exit at once, not up to kill_grace + 40 s later."""
    busy = EngineSample("vllm", 4, 0.0, 100, 100, False, None)
    stall = Event("engine_stall", Severity.CRITICAL, "stalled", 0.0, engine="e")
    for told, said in [(False, []), (True, ["engine_exited"])]:
        sink = Recorded()
        watch = _watch(tmp_path, sleeper.pid, sink)
        life = watch.engines["e"].lifecycle
        instance = frozenset({(sleeper.pid, 1.0)})
        life.observe(Look(0.0, busy, instance))
        assert any(isinstance(t, Stalled) for t in life.observe(Look(10_000.0, busy, instance)))
        life.observe(Look(10_001.0, None, frozenset()))  # gone: held
        watch.learn(Event("engine_suspect", Severity.WARNING, "other news", 0.0, engine="e"))  # teaches nothing
        if told:
            watch.learn(stall)
        assert [e.kind for e in sink.events] == said


def test_a_kill_whose_wait_never_ends_is_still_a_kill_the_budget_counts_and_a_page(tmp_path, sleeper, monkeypatch):
    """The signals went but the wait for the processes never ended (a /proc read or a process stuck in the
    kernel: that cannot be made here, so the killer is replaced by one that hangs past the deadline). It was
    only logged: no page, no outcome, the kill uncounted, and the next stall could kill again unbounded."""
    import time as time_

    from gpuwarden.act import actuator as actuator_module

    monkeypatch.setattr(policy, "KILL_SLACK", 0.5)
    monkeypatch.setattr(actuator_module, "kill", lambda procs, grace, dry_run: time_.sleep(3))
    watch = _watch(tmp_path, sleeper.pid, kill_grace=1)
    state = watch.engines["e"]
    assert asyncio.run(watch.inspect(state))
    kill_ = policy.Kill("e", "stalled", restart=True, target=state.target())
    sink = Recorded()

    async def scenario():
        actuator = Actuator(sink, NoTake(), CacheConfig(dirs=[]))
        actuator.execute(kill_, Event("engine_stall", Severity.CRITICAL, "stalled", 0.0, engine="e"))
        await asyncio.gather(*actuator._tasks)

    asyncio.run(scenario())
    [killed] = sink.events  # and no engine_restarting: nothing is started beside what may still be there
    assert killed.kind == "engine_killed" and killed.severity == Severity.CRITICAL
    assert killed.evidence["unfinished"] and killed.evidence["restart"] is False
    assert "look at it by hand" in killed.message
