"""Fixtures for integration tests; the parts themselves are in helpers.py."""

import inspect
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import JOURNALD, Daemon, FakeEngine, NotifySocket, Receiver, free_port, wait_for, write_kmsg

from peers.engines import Spares, lane, missing


@pytest.fixture
def daemon_factory(tmp_path):
    made: list[Daemon] = []

    def make(config: str = "", tmp: Path | None = None, **kw) -> Daemon:
        d = Daemon(tmp or tmp_path, config, **kw)  # several daemons need a folder each
        made.append(d)
        return d

    yield make
    for d in made:
        if d.proc and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


@pytest.fixture
def notify_socket(tmp_path):
    ns = NotifySocket(tmp_path / "notify.sock")
    yield ns
    ns.close()


@pytest.fixture(scope="session")
def journald():
    """A running systemd-journald: the one already there, or one started here (stopped at the end)."""
    if not shutil.which("journalctl") or not Path(JOURNALD).exists():
        pytest.fail("systemd-journald is not installed (make test-deps installs it)")
    started = None
    if not _host_journald():
        started = subprocess.Popen([JOURNALD], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: Path("/run/systemd/journal/socket").exists(), 10, what="journald's socket")
    token = f"gpuwarden-journald-ready-{os.getpid()}-{time.time_ns()}"
    write_kmsg(token)
    wait_for(lambda: token in subprocess.run(["journalctl", "-k", "-n", "50", "-o", "cat"],
                                            capture_output=True, text=True).stdout, 10, what="journald to read kmsg")
    yield
    if started:
        started.send_signal(signal.SIGTERM)
        started.wait(10)


def _host_journald() -> bool:
    """A journald of this host: one of a container (the nspawn systemd of the lane beside, make test's step 2) is
    seen by pgrep too, but reads neither this host's kmsg nor its journal socket. Its /proc/PID/root reads "/" as
    well (its pivoted root is out of our reach), so the mount namespace tells them apart."""
    pids = subprocess.run(["pgrep", "-x", "systemd-journal"], capture_output=True, text=True).stdout.split()
    ours = _mount_namespace("self")
    return any(_mount_namespace(pid) == ours for pid in pids)


def _mount_namespace(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


@pytest.fixture
def receiver():
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture
def fake_engine(tmp_path, corpus):
    made: list[FakeEngine] = []

    def make(mode: str = "progress", *flags: str, dump: str = "vllm-01.prom", profile: str = "vllm",
             port: int | None = None) -> FakeEngine:
        engine = FakeEngine(tmp_path, corpus / "metrics" / dump, profile, mode, *flags, port=port)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.kill()


@pytest.fixture(scope="module")
def spare_engines(tmp_path_factory):
    """Slow-starting engines (vLLM) started ahead for the module's next test (tests/peers/engines.py Spares)."""
    spares = Spares(tmp_path_factory.mktemp("spare-engines"), free_port)
    yield spares
    spares.stop()


@pytest.fixture
def servers(request, tmp_path, spare_engines):
    """Real engine servers (tests/peers), each test's own, stopped (whole trees) after it. A slow starter asked
    for is started ahead for the module's next test when that test uses this fixture too and names the kind."""
    started = []
    items = request.session.items
    following = items[items.index(request.node) + 1:items.index(request.node) + 2]
    ahead = [inspect.getsource(item.function) for item in following
             if item.module is request.node.module and "servers" in item.fixturenames]

    def start(kind, **kw):
        if why := missing(kind.name):
            pytest.fail(why)
        if lane(request.node.name) != kind.name:
            pytest.fail(f"{request.node.name} starts {kind.name} in the {lane(request.node.name)} lane of `make test`: "
                        "a test that runs vLLM says so in its name (tests/conftest.py)")
        server = spare_engines.take(kind, kw) or kind(free_port(), tmp_path / "engines", **kw).start()
        if any(f"servers({kind.__name__}" in source for source in ahead):
            spare_engines.prepare(kind, kw)
        started.append(server)
        return server
    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def docker_engine():
    """A running Docker engine (tests/peers/docker.py): the one already answering, or one started here and
    stopped after the module (nothing else needs it running)."""
    from peers.docker import Dockerd

    engine = Dockerd()
    try:
        yield engine.start()
    finally:
        engine.stop()


@pytest.fixture
def containers(request, docker_engine, tmp_path):
    """llama-server in containers, removed (with their host twins) after the test whatever happened."""
    from peers.docker import LlamaContainer

    started = []

    def start(**kw) -> LlamaContainer:
        if lane(request.node.name) != "llamacpp":
            pytest.fail(f"{request.node.name} runs llama.cpp in a container in the vllm lane of `make test`")
        box = LlamaContainer(free_port(), tmp_path / "engines", **kw)
        started.append(box)
        return box.start()
    yield start
    for box in started:
        box.stop()
