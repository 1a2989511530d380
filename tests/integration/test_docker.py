"""A real Docker engine (Debian's docker.io, tests/peers/docker.py) and a real llama-server in a container
with its port published on 127.0.0.1: the `docker` kill target and the Docker log source.

The container's processes are the Engine API's answer (`/containers/{id}/top`), each proven by its cgroup;
a host process with the very same command line (the container's "twin", in a network namespace of its own)
is never taken. The log is the Engine API's followed stream, its 8-byte frames demultiplexed.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request

import psutil
import pytest
from helpers import GPUWARDEN, wait_for

from gpuwarden.engine.discovery import discover, with_source
from gpuwarden.engine.dockerapi import container_of
from gpuwarden.engine.dockerlog import DockerLines
from gpuwarden.engine.processes import TargetSpec, resolve
from peers import slowload
from peers.docker import SOCKET, docker
from peers.freezer import Freezer, freeze_inside_a_decode
from peers.load import Load

INTERVAL, MIN_STALL, GRACE, CANARY = 2.0, 10.0, 10.0, 5.0
BUSY = 25.0  # a busy engine is watched this long and must never be called stalled
BAD = {"engine_stall", "engine_unresponsive", "engine_killed", "kill_refused"}

pytestmark = pytest.mark.root  # dockerd, ptrace, and killing root's container processes


def events(d, kinds):
    return [e for e in d.events() if e["kind"] in kinds]


def wait_event(d, kind, timeout):
    return wait_for(lambda: next(iter(events(d, {kind})), None), timeout, interval=0.25, what=f"a {kind} event")


def test_the_docker_target_is_the_containers_processes_proven_by_their_cgroup(containers):
    box = containers()
    twin = box.start_twin()
    pids = box.pids()
    assert len(pids) == 2  # docker-init and llama-server
    assert psutil.Process(twin.pid).cmdline() == psutil.Process(box.engine_pid()).cmdline()  # the same command
    cid = box.inspect()["Id"]
    assert {container_of(pid) for pid in pids} == {cid} and container_of(twin.pid) is None

    found = resolve(TargetSpec("docker", container=box.name, port=box.port, host="127.0.0.1"))
    assert sorted(p.pid for p in found.roots) == pids and not found.refused
    assert found.uid == 0  # the published port is served by root's docker-proxy
    by_id = resolve(TargetSpec("docker", container=cid[:12], uid=0))
    assert sorted(p.pid for p in by_id.roots) == pids

    gone = resolve(TargetSpec("docker", container="gwtest-no-such-container", uid=0))
    assert gone.roots == [] and "No such container" in gone.refused[0]


def test_an_engine_in_a_container_is_discovered_with_its_container_and_its_docker_log(containers, daemon_factory):
    """llama-server with neither /metrics nor /slots, in a container with its own network: found by the port
    its container publishes, and watched through the container's log."""
    box = containers(metrics=False, flags=("--no-slots",))
    found = [f for f in discover() if f.container == box.name]
    assert [(f.profile, f.port, f.pid) for f in found] == [("llamacpp", box.port, box.engine_pid())]
    assert with_source(found[0]).source == "log" and with_source(found[0]).log_container == box.name
    out = subprocess.run([*GPUWARDEN, "probe", "--json", box.metrics_url], capture_output=True, text=True, timeout=30)
    assert f'log_container = "{box.name}"' in json.loads(out.stdout)["hint"]
    d = daemon_factory("[engines]\ndiscover = true\n").start()  # its defaults
    d.wait_log(f"serving on port {box.port} (pid {box.engine_pid()} in container {box.name}): watching it through "
               f"the Docker log of container {box.name}", timeout=30)


def complete(url: str, tokens: int) -> None:
    body = json.dumps({"prompt": [1, 2, 3], "n_predict": tokens}).encode()
    urllib.request.urlopen(urllib.request.Request(f"{url}/completion", body), timeout=30).read()


def serves(url: str) -> bool:
    try:
        return urllib.request.urlopen(f"{url}/health", timeout=2).status == 200
    except OSError:
        return False


def until_a_request_ends(lines: DockerLines) -> list[str]:
    seen: list[str] = []
    wait_for(lambda: seen.extend(lines.read()) or any("stop processing" in line for line in seen), 15,
             what="a request's end in the Docker log")
    return seen


@pytest.mark.parametrize("tty", [False, True], ids=["multiplexed", "tty"])
def test_the_docker_log_from_now_on_followed_across_a_restart_never_twice(containers, tty):
    box = containers(tty=tty)
    lines = DockerLines(box.name, SOCKET)
    try:
        assert lines.read() == []  # from now on: the start-up lines before are not news
        complete(box.url, 8)
        first = until_a_request_ends(lines)
        assert sum("processing task" in line for line in first) == 1
        docker("restart", "--time", "1", box.name)
        wait_for(lambda: box.running() and serves(box.url), 30, what="the restarted container to serve")
        complete(box.url, 8)
        seen = until_a_request_ends(lines)
        assert sum("llama_server: initializing" in line for line in seen) == 1, seen  # the new start-up, once
        assert sum("processing task" in line for line in seen) == 1  # the first request not read again
    finally:
        lines.close()


def test_llamacpp_in_a_container_from_its_docker_log_busy_is_never_killed_frozen_is_killed_through_docker(
        containers, daemon_factory):
    """llama-server without --metrics in a container: its progress read from the Docker log (Engine API,
    followed), a frozen inference thread a stall confirmed by the canary, and the kill through kind = "docker":
    the container's processes, not the host twin with the same command line."""
    box = containers(metrics=False)
    twin = box.start_twin()
    d = daemon_factory(
        f'[[engine]]\nname = "engine"\nmetrics_url = "{box.metrics_url}"\nsource = "log"\n'
        f'log_container = "{box.name}"\nprofile = "llamacpp"\nscrape_interval = "{INTERVAL}s"\n'
        f'min_stall = "{MIN_STALL}s"\nkill_grace = "{GRACE}s"\ncanary_timeout = "{CANARY}s"\n'
        f'[engine.target]\nkind = "docker"\ncontainer = "{box.name}"\n').start()
    d.wait_serving()
    pids = box.pids()
    with Load(box.url, streams=4, max_tokens=300, deadline=BUSY + 60, timeout=120):
        running = wait_for(lambda: "gpuwarden_engine_requests_running{" in d.metrics()
                           and any(line.startswith("gpuwarden_engine_requests_running") and float(line.split()[-1])
                                   >= 1 for line in d.metrics().splitlines()), 20, interval=0.5,
                           what="the Docker log to say requests run")
        assert running
        time.sleep(BUSY)
        assert not events(d, BAD), [e["message"] for e in events(d, BAD)]
        freezer = Freezer(box.engine_pid()).__enter__()
        stalled_at = time.monotonic()
        try:
            stall = wait_event(d, "engine_stall", MIN_STALL + 60)
            assert f"read from the Docker log of container {box.name}" in stall["message"]
            assert stall["evidence"]["canary"]["outcome"] == "timeout", stall["evidence"]["canary"]
            killed = wait_event(d, "engine_killed", 30)
            wait_for(lambda: box.gone(pids), GRACE + 10, interval=0.1, what="the container's processes to be gone")
            took = time.monotonic() - stalled_at
        finally:
            freezer.thaw()
    taken = sorted(int(e.split()[0]) for e in killed["evidence"]["terminated"] + killed["evidence"]["killed"])
    assert taken == pids, (taken, pids, killed["message"])
    wait_for(lambda: not box.running(), 15, what="the container to stop")
    assert twin.poll() is None and os.readlink(f"/proc/{twin.pid}/exe").endswith("llama-server")
    print(f"llama.cpp in a container (Docker log): onset to the container's processes gone {took:.1f} s")


def nth_event(d, kind, count, timeout):
    return wait_for(lambda: (found := events(d, {kind})) and len(found) >= count and found[count - 1], timeout,
                    interval=0.5, what=f"{count} {kind} event(s)")


def requests_running(d) -> float:
    return max((float(line.split()[-1]) for line in d.metrics().splitlines()
                if line.startswith("gpuwarden_engine_requests_running{")), default=0.0)


def test_on_stall_restart_kills_the_container_starts_it_through_the_engine_api_and_a_start_that_never_serves_fails_once(
        containers, daemon_factory, tmp_path):
    """stall → kill → engine_restarting → the container started through the Engine API → a real completion →
    engine_back; then a start that hangs in its model load (the slow-load shim, held by a file put into the
    container): one critical engine_restart_failed after restart_timeout, and no restart loop."""
    hold = "/gwtest-hold-load"
    box = containers(env={"LD_PRELOAD": str(slowload.shim()), "GWTEST_HOLD_LOAD": hold})
    d = daemon_factory(
        f'[[engine]]\nname = "engine"\nmetrics_url = "{box.metrics_url}"\nprofile = "llamacpp"\n'
        f'scrape_interval = "1s"\nmin_stall = "5s"\nkill_grace = "2s"\ncanary_timeout = "5s"\n'
        f'on_stall = "restart"\non_unresponsive = "restart"\nrestart_timeout = "30s"\n'
        f'[engine.target]\nkind = "docker"\ncontainer = "{box.name}"\n').start()
    d.wait_serving()

    def stall_until_killed(count: int) -> None:
        pid = box.engine_pid()
        with Load(box.url, streams=2, max_tokens=300, deadline=120, timeout=120):
            wait_for(lambda: requests_running(d) >= 1, 30, interval=0.5, what="requests running")
            freezer = Freezer(pid).__enter__()
            try:
                nth_event(d, "engine_killed", count, MIN_STALL + 60)
            finally:
                freezer.thaw()

    stall_until_killed(1)
    killed = events(d, {"engine_killed"})[0]
    assert killed["severity"] == "critical" and killed["evidence"]["restart"], killed["message"]
    assert "restarting it through its Docker container" in killed["message"]
    restarting = nth_event(d, "engine_restarting", 1, 30)
    assert restarting["evidence"]["supervisor"] == f"Docker container {box.name}"
    back = nth_event(d, "engine_back", 1, 90)
    # proven by its tokens or by the canary's completion, whichever comes first (issue 41)
    assert back["evidence"]["proof"] in ("tokens", "canary") and back["evidence"]["seconds_since_kill"]
    assert box.running() and serves(box.url)
    print(f"llama.cpp in a container back {back['evidence']['seconds_since_kill']} s after the kill")

    flag = tmp_path / "hold"
    flag.write_text("hold the next load\n")
    docker("cp", str(flag), f"{box.name}:{hold}")
    stall_until_killed(2)
    failed = nth_event(d, "engine_restart_failed", 1, 30 + 60)
    assert failed["severity"] == "critical" and failed["evidence"]["by_gpuwarden"], failed
    assert "never completed a request" in failed["message"] and "will not restart it again" in failed["message"]
    time.sleep(10)  # nothing more: no second restart, no kill of the engine that holds in its load
    assert [len(events(d, {k})) for k in ("engine_killed", "engine_restarting", "engine_restart_failed",
                                           "engine_back")] == [2, 2, 1, 1]
    assert box.running() and not serves(box.url)


def _dockerd() -> psutil.Process:
    """The dockerd that answers on the test socket (started by the fixture, adopted, or another's)."""
    found = [p for p in psutil.process_iter(["name", "cmdline"]) if p.info["name"] == "dockerd"]
    serving = [p for p in found if f"unix://{SOCKET}" in " ".join(p.info["cmdline"] or ())] or found
    assert len(serving) == 1, [p.info for p in found]
    return serving[0]


PAUSE = 18.0  # dockerd stopped this long during the restart (issue 36)


def test_a_restart_outlives_dockerd_stopped_for_18_s_and_its_pages_never_contradict(containers, daemon_factory,
                                                                                    receiver):
    """Issue 36: one Engine API timeout (~1.5 s) while dockerd was paused became engine_restart_failed "will not
    restart it again", the container left Exited (137), and the page said both "Nothing to do yet: restarting
    it" and "did not come back within restart_timeout". Now: asked again with backoff, the container is started
    once dockerd resumes, back is confirmed by a real completion, and no page says it failed."""
    box = containers()
    alerts = (f'[alerts]\ngroup_window = "300ms"\nretry_initial = "200ms"\nretry_max = "500ms"\nhostname = "box1"\n'
              f'urls = ["json://127.0.0.1:{receiver.port}/hook"]\n')
    d = daemon_factory(
        alerts + f'[[engine]]\nname = "engine"\nmetrics_url = "{box.metrics_url}"\nprofile = "llamacpp"\n'
        f'scrape_interval = "1s"\nmin_stall = "5s"\nkill_grace = "2s"\ncanary_timeout = "5s"\n'
        f'on_stall = "restart"\non_unresponsive = "restart"\nrestart_timeout = "90s"\n'
        f'[engine.target]\nkind = "docker"\ncontainer = "{box.name}"\n').start()
    d.wait_serving()
    dockerd = _dockerd()
    pid = box.engine_pid()
    with Load(box.url, streams=2, max_tokens=300, deadline=120, timeout=120):
        wait_for(lambda: requests_running(d) >= 1, 30, interval=0.5, what="requests running")
        # inside a decode, where /metrics still answers: a stall, never an unresponsive engine (frozen elsewhere,
        # its /metrics hangs too, and no stall gauge ever rises: this test once waited 70 s for one)
        freezer = freeze_inside_a_decode(pid, box.metrics_url)
        try:
            # the moment the stall is said (its gauge, read over loopback: faster than the store), dockerd stops:
            # the kill's target is the stall's own look, and the restart that follows meets a paused dockerd
            wait_for(lambda: 'gpuwarden_engine_stalled{engine="engine"} 1.0' in d.metrics(), MIN_STALL + 60,
                     interval=0.02, what="the stall")
            dockerd.suspend()
            paused = time.monotonic()
            try:
                wait_event(d, "engine_killed", 30)
                retrying = wait_event(d, "engine_restart_retrying", PAUSE - 2)
                time.sleep(max(0.0, PAUSE - (time.monotonic() - paused)))
            finally:
                dockerd.resume()
        finally:
            freezer.thaw()
    back = wait_event(d, "engine_back", 90)
    assert box.running() and serves(box.url)
    assert f"its Docker container {box.name} did not start it" in retrying["message"], retrying["message"]
    assert retrying["evidence"]["command"] == f"docker start {box.name}"
    assert back["evidence"]["proof"] in ("tokens", "canary")  # its tokens or the canary, whichever came first
    counts = [len(events(d, {k})) for k in ("engine_killed", "engine_restarting", "engine_restart_failed")]
    assert counts == [1, 1, 0], [e["message"] for e in d.events()]
    print(f"llama.cpp in a container, dockerd stopped {PAUSE:.0f} s: back {back['evidence']['seconds_since_kill']} "
          "s after the kill")

    wait_for(lambda: any("back" in b["title"] for b in receiver.json_bodies("/hook")), 20, interval=0.2,
             what="the page that says it is back")
    pages = receiver.json_bodies("/hook")
    text = "\n".join(b["title"] + "\n" + b["message"] for b in pages)
    for false in ("NOT back", "did not come back", "will not restart it again", "could not be started",
                  "<container>", "<unit>"):
        assert false not in text, (false, text)
    assert pages[-1]["title"].startswith("box1: engine engine back"), [b["title"] for b in pages]
