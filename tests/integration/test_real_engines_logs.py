"""Engines watched without /metrics, against real engines (tests/peers): progress from the engine's own log
(a file, or the journal of its unit), llama.cpp's /slots, and the one-token canary.

A llama-server started without --metrics and a vLLM whose /metrics is ignored: busy and progressing for over
a minute, never killed; a frozen inference thread (llama.cpp, by ptrace) or a stopped EngineCore (vLLM): a
stall read from the log, confirmed by a canary that does not return, and the whole tree killed; a canary
against a frozen idle server: engine_unresponsive, and killed as on_unresponsive says.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from helpers import GPUWARDEN, wait_for
from test_real_engines import LONG_CONTEXT, long_request

from peers.engines import LlamaCpp, Vllm, is_gone
from peers.freezer import Freezer
from peers.load import Load

INTERVAL, MIN_STALL, GRACE, CANARY = 2.0, 10.0, 10.0, 5.0
QUIET = 65.0  # a busy engine is watched this long (at least 60 s) and must never be called stalled
BAD = {"engine_stall", "engine_unresponsive", "engine_killed", "kill_refused"}

pytestmark = pytest.mark.root  # ptrace, cgroups, and killing engine trees


def engine(server, **settings) -> str:
    opts = {"scrape_interval": f'"{INTERVAL}s"', "scrape_timeout": '"2s"', "min_stall": f'"{MIN_STALL}s"',
            "kill_grace": f'"{GRACE}s"', "canary_timeout": f'"{CANARY}s"'}
    opts.update(settings)
    return (f'[[engine]]\nname = "engine"\nmetrics_url = "{server.metrics_url}"\n'
            + "".join(f"{k} = {v}\n" for k, v in opts.items()))


def from_log(server, profile: str, **settings) -> str:
    return engine(server, source='"log"', log_file=f'"{server.log}"', profile=f'"{profile}"', **settings)


def events(d, kinds=None):
    return [e for e in d.events() if kinds is None or e["kind"] in kinds]


def wait_event(d, kind, timeout=60.0):
    return wait_for(lambda: next(iter(events(d, {kind})), None), timeout, interval=0.25, what=f"a {kind} event")


def canaries(d, outcome: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in d.metrics().splitlines()
               if line.startswith("gpuwarden_engine_canaries_total") and f'outcome="{outcome}"' in line)


def assert_stall_from_log_confirmed_and_killed(d, server, stalled_at: float) -> float:
    # whichever sees it first: the log's stall confirmed by a canary, or the idle canary (it runs too while the
    # log shows no progress) that does not return; either kills, and then the other is never reported
    found = wait_for(lambda: next(iter(events(d, {"engine_stall", "engine_unresponsive"})), None), MIN_STALL + 60,
                     interval=0.25, what="an engine_stall or engine_unresponsive event")
    assert found["evidence"]["canary"]["outcome"] == "timeout", found["evidence"]["canary"]
    if found["kind"] == "engine_stall":
        assert found["evidence"]["source"] == "log" and found["evidence"]["figures"]["running"] >= 1
        assert f"a real completion did not return in {CANARY:.0f} s" in found["message"]  # (maybe not even connect)
    killed = wait_event(d, "engine_killed", timeout=30)
    # the stall's kill, or the idle canary's (no progress: it runs too) that came first
    assert killed["message"].endswith(("(stalled)", "(a real completion did not return)")), killed["message"]
    wait_for(server.gone, GRACE + 10, interval=0.1, what="every process of the engine's tree to be gone")
    return time.monotonic() - stalled_at


# --- llama.cpp without --metrics ----------------------------------------------------------------------------

def test_llamacpp_without_metrics_busy_is_never_killed_and_a_frozen_loop_is_a_log_stall_confirmed_and_killed(
        servers, daemon_factory):
    server = servers(LlamaCpp, metrics=False)
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(server.metrics_url, timeout=5)  # no /metrics at all
    d = daemon_factory(from_log(server, "llamacpp", canary_interval='"4s"')).start()
    d.wait_serving()
    with Load(server.url, streams=4, max_tokens=300, deadline=QUIET + 60, timeout=120):
        time.sleep(QUIET)
        assert not events(d, BAD), [(e["message"], e["evidence"].get("canary")) for e in events(d, BAD)]
        assert canaries(d, "ok") == 0  # busy and progressing: no canary
        freezer = Freezer(server.proc.pid).__enter__()
        stalled_at = time.monotonic()
        try:
            took = assert_stall_from_log_confirmed_and_killed(d, server, stalled_at)
        finally:
            freezer.thaw()
    print(f"llama.cpp (log) inference thread frozen: onset to tree gone {took:.1f} s (threshold {MIN_STALL} s, "
          f"canary {CANARY} s)")


def test_a_canary_against_a_frozen_idle_llamacpp_is_engine_unresponsive(servers, daemon_factory):
    server = servers(LlamaCpp, metrics=False)
    d = daemon_factory(from_log(server, "llamacpp", canary_interval='"3s"')).start()
    d.wait_serving()
    wait_for(lambda: canaries(d, "ok") >= 2, 30, interval=0.5, what="two canaries that returned")
    with Freezer(server.proc.pid):
        event = wait_event(d, "engine_unresponsive", timeout=30)
        assert event["evidence"]["canary"]["outcome"] == "timeout"
        assert f"a real completion did not return in {CANARY:.0f} s" in event["message"]
        killed = wait_event(d, "engine_killed", timeout=20)
        assert "(a real completion did not return)" in killed["message"]
        wait_for(server.gone, GRACE + 10, what="llama-server to be gone")
    assert not events(d, {"engine_stall"})


def test_llamacpp_log_from_its_units_journal(servers, daemon_factory, journald):
    unit = f"gwtest-llama-{os.getpid()}-{time.time_ns()}.service"
    server = servers(LlamaCpp, metrics=False, unit=unit)
    d = daemon_factory(engine(server, source='"log"', log_unit=f'"{unit}"', profile='"llamacpp"')).start()
    d.wait_serving()
    with Load(server.url, streams=4, max_tokens=300, deadline=90, timeout=120):
        time.sleep(3 * INTERVAL)
        seen = subprocess.run(["journalctl", f"_SYSTEMD_UNIT={unit}", "-o", "cat", "-n", "50"], capture_output=True,
                              text=True, timeout=10).stdout
        assert "processing task" in seen  # the engine's lines are in the journal under its unit
        assert not events(d, BAD)
        with Freezer(server.proc.pid):
            stall = wait_event(d, "engine_stall", timeout=MIN_STALL + 30)
            assert f"read from the journal of {unit}" in stall["message"]
            assert stall["evidence"]["canary"]["outcome"] == "timeout"
            wait_event(d, "engine_killed", timeout=30)
            wait_for(server.gone, GRACE + 10, what="llama-server to be gone")


def test_llamacpp_slots_are_per_step_progress_and_hang_with_a_frozen_loop(servers, daemon_factory):
    """/slots without --metrics: a long request (n_decoded moves every step) is never a stall; frozen, /slots
    either answers with n_decoded standing still (a stall) or hangs with the loop (engine_unresponsive with a
    request running): either way the engine is killed."""
    server = servers(LlamaCpp, model="slow", slots=1, metrics=False, context=LONG_CONTEXT)
    tokens = long_request(server, 60)  # still running when frozen, 30 s in
    out = subprocess.run([*GPUWARDEN, "probe", "--json", server.metrics_url], capture_output=True, text=True,
                         timeout=30)
    report = json.loads(out.stdout)
    assert out.returncode == 1 and not report["up"] and 'source = "slots"' in report["hint"]  # probe says what to use
    d = daemon_factory(engine(server, source='"slots"')).start()
    d.wait_serving()
    with Load(server.url, streams=1, max_tokens=tokens, requests=1, timeout=600) as load:
        time.sleep(30)
        assert not events(d, BAD), [e["message"] for e in events(d, BAD)]
        assert not load.results, (load.results, server.log_tail())
        with Freezer(server.proc.pid):
            killed = wait_event(d, "engine_killed", timeout=MIN_STALL + 40)
            wait_for(server.gone, GRACE + 10, what="llama-server to be gone")
    seen = events(d, {"engine_stall", "engine_unresponsive"})
    print("frozen llama.cpp through /slots:", [(e["kind"], e["message"]) for e in seen], killed["message"])
    assert len(seen) == 1
    if seen[0]["kind"] == "engine_stall":  # /slots answered with n_decoded standing still
        assert seen[0]["evidence"]["figures"]["running"] == 1 and "(stalled)" in killed["message"]
    else:  # /slots hung with the loop
        assert seen[0]["evidence"]["requests_running"] == 1 and "/slots" in seen[0]["message"]


# --- vLLM, its /metrics ignored -----------------------------------------------------------------------------

def test_vllm_from_its_log_busy_is_never_killed_and_a_stopped_engine_core_is_a_log_stall_confirmed_and_killed(
        servers, daemon_factory):
    vllm = servers(Vllm)
    d = daemon_factory(from_log(vllm, "vllm")).start()
    d.wait_serving()
    with Load(vllm.url, streams=8, max_tokens=1500, deadline=QUIET + 120, timeout=180):
        time.sleep(QUIET)
        assert not events(d, BAD), events(d, BAD)
        assert "Avg generation throughput" in vllm.log.read_text()
        os.kill(vllm.process("VLLM::EngineCore"), signal.SIGSTOP)
        stalled_at = time.monotonic()
        took = assert_stall_from_log_confirmed_and_killed(d, vllm, stalled_at)
    assert not any(not is_gone(pid) for pid in vllm.tree)
    print(f"vLLM (log) EngineCore stopped: onset to tree gone {took:.1f} s (threshold 20 s = two 10 s log "
          f"intervals, canary {CANARY} s)")
