"""A killed engine that comes back: its supervisor starts a new instance, which loads (503 "Loading model") for
a long time. It must never be judged by the dead instance's figures (its requests running, its last answer),
nor held to anything while it loads; it is back once a real completion returns (engine_back).

The supervisor here is a shell loop, as systemd's Restart=always would be (this host has no systemd as PID 1:
tests/integration/test_real_systemd.py runs gpuwarden's own restart through a real unit, test_docker.py through
a real container). Each instance runs in a session of its own (setsid), as systemd starts a service, so that
the kill takes the engine and never the supervisor.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import FAKE_ENGINE, GPUWARDEN, free_port, wait_for

from peers import slowload
from peers.engines import LlamaCpp, Vllm, core, missing
from peers.freezer import Freezer
from peers.load import Load

BAD = {"engine_unresponsive", "kill_refused", "engine_restart_failed"}


class Supervised:
    """`first` run, then `again` each time the instance before ended (a Restart=always), each instance in a
    session of its own."""

    def __init__(self, first: list[str], again: list[str], tmp: Path) -> None:
        self.pids = tmp / "instances"

        def run(command: list[str]) -> str:
            return f"setsid -w {shlex.join(command)} & echo $! >> {self.pids}; wait $!"
        self.loop = subprocess.Popen(["bash", "-c", f"{run(first)}; while :; do sleep 0.2; {run(again)}; done"],
                                     start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        os.killpg(self.loop.pid, signal.SIGKILL)
        self.loop.wait(10)
        for line in self.pids.read_text().split() if self.pids.exists() else []:
            try:
                os.killpg(int(line), signal.SIGKILL)  # setsid: the instance leads its own group
            except ProcessLookupError:
                pass


def events(d, kinds):
    return [e for e in d.events() if e["kind"] in kinds]


def wait_event(d, kind, timeout, count=1):
    return wait_for(lambda: (found := events(d, {kind})) and len(found) >= count and found[count - 1], timeout,
                    interval=0.5, what=f"{count} {kind} event(s)")


def gauge(d, name, engine):
    for line in d.metrics().splitlines():
        if line.startswith(f'{name}{{engine="{engine}"}}'):
            return float(line.split()[-1])
    return None


def status_of(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def check_back(d, loading: float, engine: str) -> dict:
    """While the new instance loads: nothing held against it, its gauges its own (nothing running, nothing
    stalled); then back, with the time since the kill."""
    killed = wait_event(d, "engine_killed", 60)
    wait_for(lambda: gauge(d, "gpuwarden_engine_stalled", engine) == 0.0, 10, interval=0.2,
             what="the stalled gauge to read 0 once it is killed")
    assert gauge(d, "gpuwarden_engine_requests_running", engine) == 0.0
    back = wait_event(d, "engine_back", loading + 60)
    assert back["severity"] == "info" and back["message"].startswith(f"{engine} back: first completion "), back
    assert back["evidence"]["seconds_since_kill"] >= loading, back
    assert back["evidence"]["canary"]["outcome"] == "ok"
    after = [e for e in events(d, BAD) if e["id"] > killed["id"]]  # the kill's own cause may be either (below)
    assert not after, [e["message"] for e in after]
    assert len(events(d, {"engine_killed"})) == 1  # the loading instance was never killed
    return back


def test_a_fake_engine_that_loads_for_20_s_after_a_kill_is_not_judged_by_the_dead_one_and_is_back(
        daemon_factory, corpus, tmp_path):
    loading, port = 20, free_port()
    pids = tmp_path / "engine.pids"
    engine = [sys.executable, str(FAKE_ENGINE), "--port", str(port), "--dump",
              str(corpus / "metrics" / "vllm-01.prom"), "--pids", str(pids)]
    supervised = Supervised(engine, [*engine, "--loading", str(loading)], tmp_path)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: status_of(f"{url}/metrics")[0] == 200, loading + 15, what="the first instance to serve")
        d = daemon_factory(
            f'[[engine]]\nname = "fake"\nmetrics_url = "{url}/metrics"\nscrape_interval = "0.5s"\n'
            f'min_stall = "2s"\nkill_grace = "1s"\nunresponsive_after = 2\ncanary_timeout = "3s"\n').start()
        d.wait_serving()
        d.wait_progress("fake")
        urllib.request.urlopen(urllib.request.Request(f"{url}/mode/stall", method="POST"), timeout=2).read()
        wait_for(lambda: status_of(f"{url}/metrics")[0] == 503, 60, interval=0.2, what="the new instance loading")
        assert "Loading model" in status_of(f"{url}/metrics")[1]
        check_back(d, loading, "fake")
        # judged afresh by its own figures: a stall of the new instance is one
        urllib.request.urlopen(urllib.request.Request(f"{url}/mode/stall", method="POST"), timeout=2).read()
        wait_event(d, "engine_killed", 30, count=2)
    finally:
        supervised.stop()


@pytest.mark.root  # ptrace
@pytest.mark.peers  # the real llama-server make test builds
def test_a_real_llamacpp_loading_for_60_s_after_a_kill_answers_503_is_never_killed_and_is_back(
        daemon_factory, tmp_path):
    if why := missing("llamacpp"):
        pytest.fail(why)
    loading = 60
    shim = slowload.shim()
    server = LlamaCpp(free_port(), tmp_path / "engines")
    supervised = Supervised(server.command(), ["env", f"LD_PRELOAD={shim}", f"GWTEST_LOAD_SECONDS={loading}",
                                               *server.command()], tmp_path)
    url = f"http://127.0.0.1:{server.port}"
    try:
        wait_for(lambda: status_of(f"{url}/health")[0] == 200, 60, what="llama-server to serve")
        d = daemon_factory(
            f'[[engine]]\nname = "llama"\nmetrics_url = "{url}/metrics"\nprofile = "llamacpp"\n'
            f'scrape_interval = "1s"\nmin_stall = "5s"\nkill_grace = "2s"\nunresponsive_after = 2\n'
            f'canary_timeout = "5s"\n').start()
        d.wait_serving()
        first = int(supervised.pids.read_text().split()[0])
        with Load(url, streams=2, max_tokens=300, deadline=120, timeout=120):
            wait_for(lambda: (gauge(d, "gpuwarden_engine_requests_running", "llama") or 0) >= 1, 30, interval=0.5,
                     what="requests running")
            freezer = Freezer(first).__enter__()
            try:
                killed = wait_event(d, "engine_killed", 60)
            finally:
                freezer.thaw()
        # Frozen in a decode, llama-server's /metrics answers (a stall: no token for 5 s) or, when the frozen
        # thread holds a lock the answer needs, not at all (unresponsive with requests running): both kill.
        assert killed["evidence"]["reason"] in ("stalled", "unresponsive with requests running"), killed
        _, body = wait_for(lambda: (answer := status_of(f"{url}/health"))[0] == 503 and answer, 30,
                                interval=0.2, what="the new llama-server to answer 503 while it loads")
        assert "Loading model" in body, body
        back = check_back(d, loading, "llama")
        print(f"llama.cpp back {back['evidence']['seconds_since_kill']} s after the kill (loading {loading} s)")
    finally:
        supervised.stop()


def post(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=2).read()


def test_a_new_instance_whose_canary_gets_401_is_back_by_its_tokens_and_its_stall_is_killed_on_time(
        daemon_factory, corpus, tmp_path):
    """Each instance wants an API key (from $VLLM_API_KEY, as vLLM reads it: not on its command line, so the
    canary has none) and its supervisor starts it again after each kill. The canary's 401 is one
    canary_misconfigured warning; the new instance's own tokens prove it back; its stall is killed within
    threshold + one scrape + 2 s, as the first instance's was."""
    interval, port = 0.5, free_port()
    engine = ["env", "VLLM_API_KEY=gwtest-key", sys.executable, str(FAKE_ENGINE), "--port", str(port), "--dump",
              str(corpus / "metrics" / "vllm-01.prom")]
    supervised = Supervised(engine, engine, tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: status_of(f"{url}/metrics")[0] == 200, 30, what="the first instance to serve")
        assert status_of(f"{url}/v1/models")[0] == 401
        d = daemon_factory(
            f'[[engine]]\nname = "keyed"\nmetrics_url = "{url}/metrics"\nscrape_interval = "{interval}s"\n'
            f'min_stall = "2s"\nkill_grace = "1s"\ncanary_timeout = "3s"\n').start()
        d.wait_serving()
        for count in (1, 2):
            d.wait_progress("keyed")
            post(f"{url}/mode/stall")
            stalled_at = time.time()
            killed = wait_event(d, "engine_killed", 30, count=count)
            stall = events(d, {"engine_stall"})[count - 1]
            threshold = stall["evidence"]["figures"]["threshold_seconds"]
            took = killed["time"] - stalled_at
            print(f"instance {count}: stall to kill {took:.2f} s (threshold {threshold} s, scrape {interval} s)")
            assert took <= threshold + interval + 2, (took, threshold)
        for back in (wait_event(d, "engine_back", 30, count=count) for count in (1, 2)):
            assert back["evidence"]["proof"] == "tokens" and back["evidence"]["tokens"] > 0, back
            # a count as people write it: 1 token, 1,250 tokens
            assert re.fullmatch(r"keyed back: (1 token|[\d,]+ tokens) in its first \d+ s \(\d+ s after the kill\)",
                                back["message"]), back["message"]
        [refused] = events(d, {"canary_misconfigured"})  # one configuration problem, said once
        assert "HTTP 401" in refused["message"] and "canary_api_key_file" in refused["message"], refused
        assert not events(d, {"engine_restart_failed", "engine_unresponsive", "kill_refused"})
    finally:
        supervised.stop()


SYSTEMCTL = """#!/bin/sh
# A stand-in for systemctl: systemd cannot run as PID 1 on this host. Its unit is a real cgroup ({cgroup}); a
# start of it fails, as a unit over its start limit or with a broken ExecStart= does.
case "$*" in
  *ControlGroup*) echo "{relative}" ;;
  *MainPID*) echo 0 ;;
  *start*) echo "Job for $4 failed because the control process exited with error code." >&2; exit 1 ;;
  *) exit 1 ;;
esac
"""


def test_a_manual_start_after_a_failed_restart_is_back_and_its_next_stall_is_killed_and_restarted(
        daemon_factory, corpus, tmp_path):
    """on_stall = "restart": the kill, then a start that fails (engine_restart_failed: not restarted again);
    a person starts the engine by hand; its back clears that, so its next stall is killed AND restarted. The
    engine runs in a real cgroup, the unit's; systemctl is a stand-in (SYSTEMCTL above)."""
    from peers.engines import unit_cgroup

    unit = f"gwtest-manual-{os.getpid()}-{time.monotonic_ns()}.service"
    cgroup = unit_cgroup(unit)
    cgroup.mkdir(parents=True)
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "systemctl").write_text(SYSTEMCTL.format(cgroup=cgroup, relative=f"/system.slice/{unit}"))
    (shim / "systemctl").chmod(0o755)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    engine = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", sys.executable, str(FAKE_ENGINE),
              "--port", str(port), "--dump", str(corpus / "metrics" / "vllm-01.prom")]
    started: list[subprocess.Popen] = []

    def start_by_hand() -> None:
        started.append(subprocess.Popen(engine, start_new_session=True))
        wait_for(lambda: status_of(f"{url}/metrics")[0] == 200, 15, what="the engine to serve")

    try:
        start_by_hand()
        d = daemon_factory(
            f'[[engine]]\nname = "manual"\nmetrics_url = "{url}/metrics"\nscrape_interval = "0.5s"\n'
            f'min_stall = "2s"\nkill_grace = "1s"\ncanary_timeout = "3s"\non_stall = "restart"\n'
            f'restart_timeout = "4s"\n[engine.target]\nkind = "unit"\nunit = "{unit}"\n',
            env={"PATH": f"{shim}:{os.environ['PATH']}"}).start()
        d.wait_serving()
        d.wait_progress("manual")
        post(f"{url}/mode/stall")
        first = wait_event(d, "engine_killed", 30)
        assert first["evidence"]["restart"], first
        wait_event(d, "engine_restart_failed", 30)
        start_by_hand()  # a person starts it again
        back = wait_event(d, "engine_back", 30)
        assert back["evidence"]["seconds_since_kill"] is not None, back
        d.wait_progress("manual")
        post(f"{url}/mode/stall")
        second = wait_event(d, "engine_killed", 30, count=2)
        assert second["evidence"]["restart"] and "not restarted" not in second["message"], second["message"]
        restarting = wait_event(d, "engine_restarting", 30, count=2)
        assert restarting["id"] > second["id"]
    finally:
        for proc in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        for pid in (cgroup / "cgroup.procs").read_text().split() if cgroup.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        wait_for(lambda: not (cgroup / "cgroup.procs").read_text().split(), 10, what="the unit's cgroup empty")
        cgroup.rmdir()


KEY = f"gwtest-{os.getpid()}-{time.time_ns()}-s3cret"
INTERVAL, MIN_STALL, GRACE = 2.0, 10.0, 10.0
ENGINE_CORE = "VLLM::EngineCore"


def keyed_events(d, kinds):
    return [e for e in d.events() if e["kind"] in kinds and e.get("engine") == "vllm"]


def nth(d, kind, count, timeout):
    return wait_for(lambda: (found := keyed_events(d, {kind})) and len(found) >= count and found[count - 1],
                    timeout, interval=0.5, what=f"{count} {kind} event(s)")


def keyed_config(url: str, receiver, **settings) -> str:
    opts = {"scrape_interval": f'"{INTERVAL}s"', "scrape_timeout": '"2s"', "min_stall": f'"{MIN_STALL}s"',
            "kill_grace": f'"{GRACE}s"', "canary_timeout": '"20s"', **settings}
    return (f'[alerts]\nhostname = "vm"\ngroup_window = "300ms"\n[[alerts.target]]\nname = "pages"\n'
            f'url = "json://127.0.0.1:{receiver.port}/pages"\nmin_severity = "info"\n'
            f'[[engine]]\nname = "vllm"\nmetrics_url = "{url}/metrics"\n'
            + "".join(f"{k} = {v}\n" for k, v in opts.items()))


def engine_core(supervised: Supervised) -> int:
    """The EngineCore of the instance now serving (the supervisor's latest)."""
    import psutil

    newest = int(supervised.pids.read_text().split()[-1])
    for proc in psutil.Process(newest).children(recursive=True):
        if proc.name().startswith(ENGINE_CORE) or " ".join(proc.cmdline()).startswith(ENGINE_CORE):
            return proc.pid
    raise LookupError(f"no {ENGINE_CORE} under {newest}")


@pytest.mark.root  # killing engine trees
@pytest.mark.peers  # the real vLLM make test builds
def test_a_keyed_vllm_is_back_by_the_configured_keys_canary_and_without_the_key_its_restart_is_still_watched(
        daemon_factory, receiver, tmp_path):
    """A real vLLM (CPU build, tests/peers) that wants an API key, restarted by its supervisor after each kill. Its
    key is in its environment ($VLLM_API_KEY, which vLLM reads as it reads --api-key), so nothing on its command
    line gives it away: a canary has it only where it is configured.

    Two daemons watch the same engine. One has the key through `canary_api_key_file` (a root-only file) and only
    alerts; the other has no key and kills. After the first stall's kill and the supervisor's start, the first
    says the new instance back by the canary's completion; the second says once that its canary is refused
    (canary_misconfigured), never "restart failed", takes the new instance back from its own tokens once users
    come, and kills its stall. The key is never in either daemon's log, events, pages, status or state."""
    if why := missing("vllm"):
        pytest.fail(why)
    server = Vllm(free_port(), tmp_path / "engines")
    settings = {k: v for k, v in server.env().items() if k not in os.environ or os.environ[k] != v}
    command = ["env", f"VLLM_API_KEY={KEY}", *(f"{k}={v}" for k, v in settings.items()), "taskset", "-c",
               str(core("vllm")), *server.command()]
    assert KEY not in " ".join(command[2:])  # the key is in its environment only
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    key_file = secret / "vllm.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    supervised = Supervised(command, command, tmp_path)
    try:
        wait_for(lambda: status_of(f"{server.url}/health")[0] == 200, server.startup_timeout,
                 what="vLLM to serve")
        assert status_of(f"{server.url}/v1/models")[0] == 401  # it wants the key
        for name in ("keyed", "keyless"):
            (tmp_path / name).mkdir()
        keyed = daemon_factory(keyed_config(server.url, receiver, on_stall='"alert"',
                                      canary_api_key_file=f'"{key_file}"'), tmp=tmp_path / "keyed")
        keyless = daemon_factory(keyed_config(server.url, receiver), tmp=tmp_path / "keyless")
        for d in (keyed, keyless):
            d.start().wait_serving()
        with Load(server.url, streams=4, max_tokens=1500, deadline=120, timeout=120, key=KEY):
            keyless.wait_progress("vllm")
            os.kill(engine_core(supervised), signal.SIGSTOP)
            nth(keyless, "engine_killed", 1, MIN_STALL + 60)
        back = nth(keyed, "engine_back", 1, server.startup_timeout + 60)  # no users yet: only a canary proves it
        assert back["evidence"]["proof"] == "canary" and back["evidence"]["canary"]["outcome"] == "ok", back
        assert "first completion" in back["message"], back["message"]
        refused = nth(keyless, "canary_misconfigured", 1, 60)
        assert "HTTP 401" in refused["message"] and "canary_api_key_file" in refused["message"], refused
        with Load(server.url, streams=4, max_tokens=1500, deadline=180, timeout=180, key=KEY):
            back = nth(keyless, "engine_back", 1, 60)  # its users' tokens prove it
            assert back["evidence"]["proof"] == "tokens" and back["evidence"]["tokens"] > 0, back
            keyless.wait_progress("vllm")
            os.kill(engine_core(supervised), signal.SIGSTOP)
            stalled_at = time.time()
            killed = nth(keyless, "engine_killed", 2, MIN_STALL + 60)
        stall = keyed_events(keyless, {"engine_stall"})[1]
        print(f"the keyless daemon: the restarted instance's stall killed {killed['time'] - stalled_at:.1f} s "
              f"after its onset (threshold {stall['evidence']['figures']['threshold_seconds']} s)")
        assert len(keyed_events(keyless, {"canary_misconfigured"})) == 1
        for d in (keyed, keyless):
            assert not keyed_events(d, {"engine_restart_failed", "engine_unresponsive", "kill_refused"})
        status = [subprocess.run([*GPUWARDEN, "--config", str(d.config_path), "status", "--json"],
                                 capture_output=True, text=True, timeout=30) for d in (keyed, keyless)]
        assert all(s.returncode == 0 and '"vllm"' in s.stdout for s in status), status
        pages = [r["body"] for r in receiver.received]
        assert pages and any("back" in p for p in pages)
        said = [d.log() for d in (keyed, keyless)] + [json.dumps(d.events()) for d in (keyed, keyless)] + pages \
            + [s.stdout for s in status]
        assert not [text for text in said if KEY in text]
        stored = subprocess.run(["grep", "-rl", KEY, str(keyed.tmp), str(keyless.tmp)], capture_output=True,
                                text=True)
        assert stored.returncode == 1 and not stored.stdout, stored.stdout  # nothing the daemons wrote holds it
    finally:
        supervised.stop()
