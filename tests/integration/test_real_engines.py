"""The engine watch against real engines: a real vLLM (CPU build, V1 engine) and a real llama.cpp llama-server,
serving tiny random-weight models on loopback, under a real load, stalled for real. Installed by
tests/peers/install.sh (make test runs it; cached outside the repository).

Each stall is made the way it happens: a stopped vLLM EngineCore or Worker (no step, the API server answers
on), a stopped API server (/metrics hangs), the llama.cpp inference thread frozen by ptrace inside a decode
(HTTP threads answer with flat counters), a stopped llama-server (nothing answers).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request

import pytest
from helpers import GPUWARDEN, driver_record, wait_for, write_kmsg

from fakesysfs import build
from peers.engines import LlamaCpp, Vllm, is_gone
from peers.freezer import freeze_inside_a_decode
from peers.load import Load
from peers.sizing import TooFast, sized

INTERVAL, MIN_STALL, GRACE = 2.0, 10.0, 10.0
GPU = "ffff:e2:00.0"  # this file's own impossible GPU: other tests' fault lines name TEST_GPU
QUIET = 65.0  # a busy engine is watched this long (at least 60 s) and must never be called stalled
LONG_CONTEXT = 16384  # tokens: room for a request sized to last QUIET + 30 s on a fast machine (KV cache 512 MiB)
BAD = {"engine_stall", "engine_unresponsive", "engine_killed", "kill_refused"}

pytestmark = pytest.mark.root  # ptrace, and killing engine trees


def engine(server, name="engine", **settings) -> str:
    opts = {"scrape_interval": f'"{INTERVAL}s"', "scrape_timeout": '"2s"', "min_stall": f'"{MIN_STALL}s"',
            "kill_grace": f'"{GRACE}s"'}
    opts.update(settings)
    return (f'[[engine]]\nname = "{name}"\nmetrics_url = "{server.metrics_url}"\n'
            + "".join(f"{k} = {v}\n" for k, v in opts.items()))


def events(d, kinds=None):
    return [e for e in d.events() if kinds is None or e["kind"] in kinds]


def wait_event(d, kind, timeout=60.0):
    return wait_for(lambda: next(iter(events(d, {kind})), None), timeout, interval=0.25, what=f"a {kind} event")


def watchers(daemon_factory, tmp_path, server, profile):
    """Three daemons on one engine: profile auto, the engine's own profile, and discovery (no [[engine]])."""
    made = []
    for name, config in (("auto", engine(server, profile='"auto"')), (profile, engine(server, profile=f'"{profile}"')),
                         ("discovery", '[engines]\ndiscover_interval = "2s"\n')):
        (tmp_path / name).mkdir()
        made.append(daemon_factory(config, tmp=tmp_path / name).start())
    for d in made:
        d.wait_serving()
    made[2].wait_log(f"serving on port {server.port}", timeout=30)
    return made


def long_request(server, seconds: float) -> int:
    """The tokens one request generates for `seconds` here, from the engine's measured decode rate."""
    try:
        tokens, how = sized(server.url, "decode", seconds, 256, LONG_CONTEXT)
    except TooFast as exc:
        pytest.skip(str(exc))  # says why; as root (CI) a skip fails the run
    print(f"{type(server).__name__}: {how}")
    return tokens


def bad_for(d, server) -> list[dict]:
    """BAD events about this test's engine (configured: "engine"; discovered: "<profile>-<port>"). A discovering
    daemon watches every engine of the host, and make test runs the containers' tests beside these."""
    return [e for e in events(d, BAD) if e.get("engine") in ("engine", f"vllm-{server.port}",
                                                             f"llamacpp-{server.port}")]


def probe(server) -> dict:
    out = subprocess.run([*GPUWARDEN, "probe", "--json", server.metrics_url], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def metric(server, name) -> float:
    body = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith(name) and line[len(name)] in " {")


def stall_to_gone(d, server, stalled_at: float) -> float:
    """Wait for the stall's kill and the whole tree gone; the seconds from stall onset to tree gone."""
    wait_event(d, "engine_killed", timeout=MIN_STALL + 60)
    wait_for(server.gone, GRACE + 10, interval=0.1, what="every process of the engine's tree to be gone")
    return time.monotonic() - stalled_at


# --- vLLM -------------------------------------------------------------------------------------------------

def test_a_busy_vllm_is_never_killed_by_any_profile_or_discovery(servers, daemon_factory, tmp_path):
    vllm = servers(Vllm)
    with Load(vllm.url, streams=8, max_tokens=1500, deadline=QUIET + 30) as load:
        daemons = watchers(daemon_factory, tmp_path, vllm, "vllm")
        time.sleep(10)
        report = probe(vllm)
        assert report["profile"] == "vllm" and report["progress"] == "per step"
        assert 1 <= report["running"] <= 8 and report["waiting"] == 0
        assert 0 < report["generated_tokens"] <= metric(vllm, "vllm:generation_tokens_total")
        time.sleep(QUIET - 10)
        results = load.stop(60)
    assert all(r.ok for r in results) and sum(r.tokens for r in results) > 0
    for d in daemons:
        assert not bad_for(d, vllm), bad_for(d, vllm)
        assert d.stop() == 0
    assert not any(is_gone(pid) for pid in vllm.tree)


@pytest.mark.parametrize("title", ["VLLM::EngineCore", "VLLM::Worker"])
def test_a_stopped_vllm_engine_core_or_worker_is_a_stall_and_the_whole_tree_goes(servers, daemon_factory, title):
    vllm = servers(Vllm)
    d = daemon_factory(engine(vllm)).start()
    d.wait_serving()
    with Load(vllm.url, streams=8, max_tokens=1500, deadline=120, timeout=120):
        time.sleep(3 * INTERVAL)
        assert not events(d, BAD)
        os.kill(vllm.process(title), signal.SIGSTOP)
        stalled_at = time.monotonic()
        took = stall_to_gone(d, vllm, stalled_at)
    stall = events(d, {"engine_stall"})[0]
    figures = stall["evidence"]["figures"]
    assert figures["running"] >= 1 and figures["threshold_seconds"] == MIN_STALL
    killed = events(d, {"engine_killed"})[0]
    assert "killed engine" in killed["message"]
    print(f"vLLM {title} stopped: stall onset to tree gone {took:.1f} s (threshold {MIN_STALL} s + scrape "
          f"{INTERVAL} s); {killed['message']}")
    # the stopped process, continued, acted on SIGTERM: the kill never waited on it
    assert any(name.split(" ", 1)[1].startswith(title[:15]) for name in killed["evidence"]["terminated"]), killed
    # the API server may spin a core through the whole grace in its shutdown (6.6 s measured), then take SIGKILL
    assert took <= MIN_STALL + INTERVAL + GRACE + 2


def test_a_stopped_vllm_api_server_is_unresponsive_and_killed_as_configured(servers, daemon_factory):
    vllm = servers(Vllm)
    d = daemon_factory(engine(vllm)).start()
    d.wait_serving()
    with Load(vllm.url, streams=8, max_tokens=1500, deadline=120, timeout=120):
        d.wait_progress("engine")
        os.kill(vllm.proc.pid, signal.SIGSTOP)
        event = wait_event(d, "engine_unresponsive", timeout=MIN_STALL + 30)
        assert event["evidence"]["requests_running"] >= 1 and "timeout" in event["message"]
        assert event["evidence"]["figures"]["silent_seconds"] >= MIN_STALL
        killed = wait_event(d, "engine_killed")
        assert "(unresponsive with requests running)" in killed["message"]
        wait_for(vllm.gone, GRACE + 10, what="the whole vLLM tree to be gone")


def test_old_fault_lines_are_history_and_a_live_one_on_a_known_gpu_makes_a_vllm_suspect_its_reset_kills(
        servers, daemon_factory, journald, receiver, tmp_path):
    """Fault lines in this boot's journal from before the daemon started (a test suite's, a crash before a
    restart) are alerted as history and never kill a busy engine; a live sq_intr (it names no process: anyone
    may raise one), naming a GPU the daemon has seen (a Radeon's sysfs tree, faked: none is here), puts the busy
    engine under suspicion, and the GPU reset that follows kills it at once.
    User space cannot write a line the kernel's own record proves (facility 0, device metadata), so the live
    lines go, as the kernel's records, to a second daemon that follows a file (helpers.driver_record)."""
    vllm = servers(Vllm)
    sysfs = build(tmp_path / "sys", {GPU: "rdna3"})
    old = f"amdgpu {GPU}: amdgpu: sq_intr: error, detail 0x00000000, type 1, sh 1 (old {time.time_ns()})"
    write_kmsg(old)
    wait_for(lambda: old in subprocess.run(["journalctl", "-k", "-n", "200", "-o", "cat"], capture_output=True,
                                           text=True).stdout, 10, what="the old line in the journal")
    config = (engine(vllm, gpus=f'["{GPU}"]', min_stall='"10m"')
              + f'[gpu]\nsysfs_root = "{sysfs}"\nnvml = false\n[guard]\nenabled = false\n'
              + f'[alerts]\nurls = ["json://127.0.0.1:{receiver.port}/hook"]\ngroup_window = "1s"\n')
    with Load(vllm.url, streams=8, max_tokens=1500, deadline=180, timeout=180):
        d = daemon_factory(config, kernel='source = "journal"\nlookback = "10m"').start()
        d.wait_serving()
        history = wait_for(lambda: [e for e in events(d, {"sq_intr"}) if "(old " in str(e["evidence"])], 20,
                           what="the old line's event")
        assert history[0]["evidence"]["history"] == "logged before gpuwarden started"
        wait_for(lambda: any("logged before gpuwarden started" in b.get("title", "") for b in receiver.json_bodies()),
                 20, what="the history alert")
        time.sleep(3 * INTERVAL)
        assert not events(d, {"engine_killed"}) and not any(is_gone(pid) for pid in vllm.tree)
        assert d.stop() == 0
        (tmp_path / "live").mkdir()
        live = daemon_factory(config, tmp=tmp_path / "live").start()
        live.wait_serving()
        with live.log_file.open("a") as log:
            log.write(driver_record(f"amdgpu {GPU}: amdgpu: sq_intr: error, detail 0x00000000, type 1, sh 1 (live)",
                                    device=GPU))
        assert wait_event(live, "engine_suspect", timeout=20)["engine"] == "engine"
        time.sleep(3 * INTERVAL)
        assert not events(live, {"engine_killed"}) and not any(is_gone(pid) for pid in vllm.tree)
        with live.log_file.open("a") as log:
            log.write(driver_record(f"amdgpu {GPU}: amdgpu: GPU reset begin!", device=GPU))
        killed = wait_event(live, "engine_killed", timeout=20)
        assert f"kernel reported gpu_reset on {GPU} after an earlier fault with no owner" in killed["message"]
        wait_for(vllm.gone, GRACE + 10, what="the whole vLLM tree to be gone")


# --- llama.cpp ----------------------------------------------------------------------------------------------

def test_a_long_llamacpp_request_is_never_killed_by_any_profile_or_discovery(servers, daemon_factory, tmp_path):
    """One request sized to last 30 s longer than the watch at the engine's decode rate measured here:
    tokens_predicted_total stays flat until it ends, the per-step n_decode_total moves all along."""
    server = servers(LlamaCpp, model="slow", slots=1, context=LONG_CONTEXT)
    tokens = long_request(server, QUIET + 30)
    with Load(server.url, streams=1, max_tokens=tokens, requests=1, timeout=600) as load:
        daemons = watchers(daemon_factory, tmp_path, server, "llamacpp")
        time.sleep(10)
        report = probe(server)
        assert report["profile"] == "llamacpp" and report["progress"] == "per step" and report["running"] == 1
        assert report["generated_tokens"] == metric(server, "llamacpp:tokens_predicted_total")
        assert report["tokens_processed"] > 0 and "llamacpp:n_decode_total" in report["families"]
        time.sleep(QUIET - 10)
        assert not load.results, "the request should still be running after a minute"
    for d in daemons:
        assert not bad_for(d, server), bad_for(d, server)
        assert d.stop() == 0
    assert not server.gone()


def test_a_frozen_llamacpp_inference_thread_is_a_stall_and_killed(servers, daemon_factory):
    server = servers(LlamaCpp)
    d = daemon_factory(engine(server)).start()
    d.wait_serving()
    with Load(server.url, streams=4, max_tokens=500, deadline=120, timeout=120):
        time.sleep(3 * INTERVAL)
        assert not events(d, BAD)
        freezer = freeze_inside_a_decode(server.proc.pid, server.metrics_url)
        stalled_at = time.monotonic()
        try:
            assert urllib.request.urlopen(f"{server.url}/health", timeout=2).status == 200  # HTTP answers on
            took = stall_to_gone(d, server, stalled_at)
        finally:
            freezer.thaw()
    stall = events(d, {"engine_stall"})[0]
    assert stall["evidence"]["figures"]["running"] >= 1
    print(f"llama.cpp inference thread frozen: stall onset to gone {took:.1f} s (threshold {MIN_STALL} s + scrape "
          f"{INTERVAL} s)")
    assert took <= MIN_STALL + INTERVAL + GRACE


def test_a_stopped_llamacpp_is_unresponsive(servers, daemon_factory):
    server = servers(LlamaCpp)
    d = daemon_factory(engine(server)).start()
    d.wait_serving()
    with Load(server.url, streams=4, max_tokens=500, deadline=120, timeout=120):
        d.wait_progress("engine")
        os.kill(server.proc.pid, signal.SIGSTOP)
        event = wait_event(d, "engine_unresponsive", timeout=MIN_STALL + 30)
        assert event["evidence"]["requests_running"] >= 1
        wait_event(d, "engine_killed")
        wait_for(server.gone, GRACE + 10, what="llama-server to be gone")
    assert not events(d, {"engine_stall"})
