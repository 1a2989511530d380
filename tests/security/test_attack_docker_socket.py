"""The `docker` kill target: whoever answers on the Docker socket names the processes root kills. A local user
who can serve that socket could aim the kill at any root process, so the socket is trusted only when it and
every folder above it are root's and the listener itself is root (SO_PEERCRED). The would-be Engine API here
(fake_docker_api.py) is run by the real user gwattacker; the victims are root processes this test started."""

import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from helpers import FakeEngine, wait_for
from test_attack_kill_targets import SLEEPER, engine_config, events_of, stalled, wait_event

from gpuwarden.engine.processes import TargetSpec, resolve

pytestmark = pytest.mark.root

API = Path(__file__).with_name("fake_docker_api.py")


def serve_api(attacker, victim_pid: int) -> Path:
    shutil.copy(API, attacker.home / API.name)
    os.chown(attacker.home / API.name, attacker.uid, attacker.gid)
    sock = attacker.home / "docker.sock"
    attacker.popen(["/usr/bin/python3", API.name, str(sock), str(victim_pid)])
    wait_for(sock.exists, 10, what="the user's Docker API socket")
    return sock


def test_a_docker_socket_the_user_serves_names_no_victim(attacker, daemon_factory, root_process, corpus, tmp_path):
    """The engine's port is root's, as a container's published port is root's docker-proxy (a port the user served
    itself is never read: test_attack_engine_port.py); the user's API naming a root process as the container's
    is refused."""
    victim = root_process(*SLEEPER)
    sock = serve_api(attacker, victim.pid)
    engine = FakeEngine(tmp_path, corpus / "metrics" / "vllm-01.prom")
    try:
        d = daemon_factory(engine_config(engine.url, f'kind = "docker"\ncontainer = "engine"\n'
                                                     f'docker_socket = "{sock}"\nuser = "root"'))
        stalled(d, engine)
        refused = wait_event(d, "kill_refused")
        assert "the Docker socket is not trusted" in refused["message"], refused["message"]
        assert f"belongs to uid {attacker.uid}, not root" in refused["message"]
        time.sleep(1)
        assert victim.poll() is None and not events_of(d, "engine_killed")
        assert engine.alive()  # nothing of it was killed either: the socket named no process gpuwarden trusts
        assert d.stop() == 0
    finally:
        engine.kill()


def test_a_root_owned_path_served_by_the_user_is_not_dockerd(attacker, root_process, tmp_path):
    """The user's listening socket moved to a root-owned path, owned by root: its listener is still the user."""
    victim = root_process(*SLEEPER)
    sock = serve_api(attacker, victim.pid)
    moved = tmp_path / "run" / "docker.sock"
    moved.parent.mkdir(mode=0o755)
    os.rename(sock, moved)
    os.chown(moved, 0, 0)
    found = resolve(TargetSpec("docker", container="engine", docker_socket=moved, uid=0))
    assert found.roots == [] and f"served by uid {attacker.uid}, not root" in found.refused[0], found.refused
    link = tmp_path / "link.sock"
    link.symlink_to(attacker.home / API.name)  # a root-owned link into the user's home: judged where it leads
    found = resolve(TargetSpec("docker", container="engine", docker_socket=link, uid=0))
    assert found.roots == [] and f"belongs to uid {attacker.uid}, not root" in found.refused[0], found.refused
    assert victim.poll() is None


def test_a_lying_engine_api_names_no_host_process(root_process, tmp_path):
    """An API that is root's but names a host process as the container's (no real dockerd does: this one is
    the test's): the process is not in the container's cgroup, so it is refused."""
    victim = root_process(*SLEEPER)
    sock = tmp_path / "docker.sock"
    api = root_process(sys.executable, str(API), str(sock), str(victim.pid))
    wait_for(sock.exists, 10, what="the API's socket")
    found = resolve(TargetSpec("docker", container="engine", docker_socket=sock, uid=0))
    assert found.roots == [] and f"{victim.pid}: the Engine API names it, but it is not in container eeeeeeeeeeee's " \
        "cgroup" in found.refused, found.refused
    assert victim.poll() is None and api.poll() is None
