"""Issue 24, finding 3: another user listening on the engine's port over the other address family. A `[::]`
(IPv6 only) beside the engine's 0.0.0.0 made the engine's user "unknown" (its stall: kill_refused); with
metrics_url on localhost, a `[::1]` listener answered the scrapes (the stuck engine read as healthy)."""

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from helpers import FAKE_ENGINE, GPUWARDEN, FakeEngine, wait_for

from gpuwarden.engine.processes import TargetSpec, resolve

pytestmark = pytest.mark.root

SYSTEM_PYTHON = "/usr/bin/python3"


def squat(attacker, host: str, port: int, corpus: Path, mode: str = "progress"):
    """The attacker's own fake engine on host:port (IPv6 alone), answering healthy /metrics."""
    for src in (FAKE_ENGINE, corpus / "metrics" / "vllm-01.prom"):
        (attacker.home / src.name).write_bytes(src.read_bytes())
        os.chown(attacker.home / src.name, attacker.uid, attacker.gid)
    proc = attacker.popen([SYSTEM_PYTHON, "fake_engine.py", "--port", str(port), "--dump", "vllm-01.prom",
                           "--mode", mode, "--host", host, "--pids", str(attacker.home / f"squat-{port}.pids")])

    def listening():
        assert proc.poll() is None, "the squatter exited"
        try:
            with socket.create_connection((host if host != "::" else "::1", port), 1):
                return True
        except OSError:
            return False
    wait_for(listening, 15, what=f"the squatter on [{host}]:{port}")
    return proc


@pytest.fixture
def engine_on(tmp_path, corpus):
    made = []

    def start(host: str, mode: str = "progress") -> FakeEngine:
        made.append(FakeEngine(tmp_path, corpus / "metrics" / "vllm-01.prom", "vllm", mode, "--host", host))
        return made[-1]
    yield start
    for engine in made:
        engine.kill()


def test_a_v6_only_wildcard_squatter_beside_the_engines_0000_changes_not_its_user(attacker, engine_on, corpus):
    engine = engine_on("0.0.0.0")
    squat(attacker, "::", engine.port, corpus)
    found = resolve(TargetSpec("port", port=engine.port, host="127.0.0.1"))
    assert found.uid == 0 and [p.pid for p in found.roots] == [engine.proc.pid], found.refused
    assert not found.refused


def test_a_v6_loopback_squatter_answers_neither_the_scrapes_nor_for_the_user(attacker, engine_on, corpus,
                                                                          daemon_factory, tmp_path):
    """metrics_url on `localhost`, where the name resolves to ::1 first (a bind-mounted /etc/hosts in a mount
    namespace of the daemon's own); the squatter on [::1] says it progresses, the engine is stuck."""
    engine = engine_on("127.0.0.1", mode="stall")
    squat(attacker, "::1", engine.port, corpus)
    hosts = tmp_path / "hosts"
    hosts.write_text("::1 localhost\n127.0.0.1 localhost\n")
    d = daemon_factory(f'[[engine]]\nname = "local"\nmetrics_url = "http://localhost:{engine.port}/metrics"\n'
                       'scrape_interval = "0.5s"\nmin_stall = "2s"\nkill_grace = "1s"\n')
    d.start("unshare", "-m", "sh", "-c", f'mount --bind {hosts} /etc/hosts && exec "$@"', "--")
    d.wait_serving()
    wait_for(lambda: [e for e in d.events() if e["kind"] in ("engine_killed", "kill_refused")], 30, interval=0.5,
             what="the stuck engine's kill (or its refusal)")
    kinds = [e["kind"] for e in d.events()]
    assert "engine_killed" in kinds and "kill_refused" not in kinds, kinds
    wait_for(lambda: not engine.alive(), 10, what="the engine's tree gone")
    time.sleep(0.5)
    assert d.stop() == 0


def test_an_ambiguous_owner_is_refused_and_shown(attacker, engine_on, corpus, tmp_path):
    """A name that resolves to two addresses served by two users (root's engine on 127.0.0.1, the attacker's on
    [::1]): no user is guessed, and `check` shows the refusal and why."""
    engine = engine_on("127.0.0.1")
    squat(attacker, "::1", engine.port, corpus)
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 dual\n::1 dual\n")
    config = tmp_path / "gpuwarden.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                      f'[[engine]]\nname = "e"\nmetrics_url = "http://dual:{engine.port}/metrics"\n')
    out = subprocess.run(["unshare", "-m", "sh", "-c", f'mount --bind {hosts} /etc/hosts && exec "$@"', "--",
                          *GPUWARDEN, "check", str(config), "--show"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "#   refused the engine's user is ambiguous: dual:" in out.stdout, out.stdout
    assert f"{engine.proc.pid} root" not in out.stdout.split("a kill now would take")[1].split("refused")[0]
