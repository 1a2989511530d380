"""Issue 38, "discovery ranked by evidence, not path": a user started the system's own root-installed engine
program many times on ports of its own. Each counted as an installed engine and they filled every discovery
slot: the real engine, started after them in a system unit, was not watched (one `discovery_flood` warning);
the user stalled them: one critical page each. Now what vouches for a server ranks it (a GPU held, a system
unit or container, then root's program, then words on a command line), and one user's servers page as one.

No GPU here: the engine's evidence is a real system unit's cgroup (system.slice/<name>.service), which only
root can make; the GPU rank (a device file held open) is not exercised by this test."""

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import FAKE_ENGINE, Receiver, free_port, wait_for

pytestmark = pytest.mark.root

SYSTEM_PYTHON = "/usr/bin/python3"
CAP, CROWD = 3, 4


@pytest.fixture
def installed(corpus):
    """fake_engine.py installed by root as <folder>/bin/vllm (0755, in 0755 root folders any user can read),
    with the /metrics it serves beside it."""
    top = Path(tempfile.mkdtemp(prefix="gw-installed-"))
    (top / "bin").mkdir()
    shutil.copy(FAKE_ENGINE, top / "bin" / "vllm")
    shutil.copy(corpus / "metrics" / "vllm-01.prom", top / "vllm-01.prom")
    for path, mode in ((top, 0o755), (top / "bin", 0o755), (top / "bin" / "vllm", 0o755),
                       (top / "vllm-01.prom", 0o644)):
        path.chmod(mode)
    yield top
    shutil.rmtree(top)


def serve_argv(top: Path, port: int, pids: Path) -> list[str]:
    return [SYSTEM_PYTHON, str(top / "bin" / "vllm"), "serve", "Qwen/Qwen3-0.6B", "--port", str(port),
            "--dump", str(top / "vllm-01.prom"), "--pids", str(pids)]


def answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 1).close()
        return True
    except OSError:
        return False


def unit_cgroup(unit: str) -> Path:
    """system.slice/<unit> of the hierarchy systemd tracks services in (as tests/peers/engines.py)."""
    root = Path("/sys/fs/cgroup")
    for base in (root / "unified", root, root / "systemd"):
        if (base / "cgroup.procs").exists():
            return base / "system.slice" / unit
    pytest.fail("no cgroup hierarchy to run a unit in")


@pytest.fixture
def in_unit(root_process):
    """Root starts a server and puts it in a system unit's cgroup, as systemd starts a service."""
    made: list[Path] = []

    def start(argv: list[str]):
        proc = root_process(*argv)
        cgroup = unit_cgroup(f"gwtest-{os.getpid()}-{proc.pid}.service")
        cgroup.mkdir(parents=True)
        made.append(cgroup)
        (cgroup / "cgroup.procs").write_text(str(proc.pid))
        return proc
    yield start
    for cgroup in made:
        for pid in (cgroup / "cgroup.procs").read_text().split():
            subprocess.run(["kill", "-9", pid], check=False)
        wait_for(lambda c=cgroup: not (c / "cgroup.procs").read_text().strip(), 10, what="the unit's processes gone")
        cgroup.rmdir()


def watched(d) -> list[str]:
    return re.findall(r'^gpuwarden_engine_up\{engine="([^"]+)"\} ', d.metrics(), re.M)


def test_a_users_crowd_of_root_installed_engines_never_pushes_out_an_engine_in_a_unit_and_pages_once(
        lone_attacker, installed, in_unit, daemon_factory):
    crowd = [free_port() for _ in range(CROWD)]
    for port in crowd:  # root's own program, started by the user: `installed`, as the real engine
        lone_attacker.popen(serve_argv(installed, port, lone_attacker.home / f"{port}.pids"))
    for port in crowd:
        wait_for(lambda p=port: answers(p), 20, what="the user's server")
    receiver = Receiver().start()
    try:
        d = daemon_factory(f'[alerts]\nurls = ["json://127.0.0.1:{receiver.port}/"]\n'
                           f'[engines]\ndiscover_interval = "1s"\nmax_discovered = {CAP}\n').start()
        d.wait_serving()
        wait_for(lambda: len(watched(d)) == CAP, 30, what="the cap filled")
        port = free_port()
        in_unit(serve_argv(installed, port, installed / "unit.pids"))
        wait_for(lambda: f"vllm-{port}" in watched(d), 30, interval=0.5, what="the engine in the unit watched")
        assert re.search(r"no longer watching vllm-\d+, root's installed program, run by anyone:", d.log())

        # the user stalls its servers still watched: one page for them all
        mine = [f"vllm-{p}" for p in crowd if f"vllm-{p}" in watched(d)]
        assert len(mine) >= 2, (mine, watched(d))
        for name in mine:
            urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{name.split('-')[1]}/mode/stall", method="POST"), timeout=5).read()
        wait_for(lambda: {e["engine"] for e in d.events() if e["kind"] == "engine_stall"} >= set(mine), 90,
                 interval=1, what="each stall")
        time.sleep(8)  # past the group window of the last one

        def about_crowd(body: str) -> bool:
            return lone_attacker.name in body or any(name in body for name in mine)
        pages = [r for r in receiver.received if about_crowd(r["body"])]
        assert len(pages) == 1, [p["body"][:300] for p in pages]
        assert f"one of the discovered engines of {lone_attacker.name}, alerted together" in pages[0]["body"]
        assert f"And {len(mine) - 1} more `engine_stall`" in pages[0]["body"], pages[0]["body"][:500]
        assert d.stop() == 0
    finally:
        receiver.stop()
