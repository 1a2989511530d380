"""A killed engine that comes back: its supervisor starts a new instance, which loads (503 "Loading model") for
a long time. It must never be judged by the dead instance's figures (its requests running, its last answer),
nor held to anything while it loads; it is back once a real completion returns (engine_back).

The supervisor here is a shell loop, as systemd's Restart=always would be (this host has no systemd as PID 1:
tests/integration/test_real_systemd.py runs gpuwarden's own restart through a real unit, test_docker.py through
a real container). Each instance runs in a session of its own (setsid), as systemd starts a service, so that
the kill takes the engine and never the supervisor.
"""

from __future__ import annotations

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
from helpers import FAKE_ENGINE, free_port, wait_for

from peers import slowload
from peers.engines import LlamaCpp, missing
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
        time.sleep(2)  # progress
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
            time.sleep(3)  # progress
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
            assert re.fullmatch(r"keyed back: \d+ tokens in its first \d+ s \(\d+ s after the kill\)",
                                back["message"]), back["message"]
        [refused] = events(d, {"canary_misconfigured"})  # one configuration problem, said once
        assert "HTTP 401" in refused["message"] and "canary_api_key_file" in refused["message"], refused
        assert not events(d, {"engine_restart_failed", "engine_unresponsive", "kill_refused"})
    finally:
        supervised.stop()
