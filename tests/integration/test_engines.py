"""The stuck-engine killer end to end: real engine processes on loopback, the real daemon, real signals."""

import itertools
import json
import re
import statistics
import subprocess
import time
from collections import Counter

import pytest
from helpers import GPUWARDEN, TEST_GPU, driver_record, free_port, wait_for

from fakesysfs import build

INTERVAL, MIN_STALL = 0.5, 2.0


def engine_config(engine, name="fake", **settings) -> str:
    opts = {"scrape_interval": f'"{INTERVAL}s"', "min_stall": f'"{MIN_STALL}s"', "kill_grace": '"1s"'}
    opts.update(settings)
    return (f'[[engine]]\nname = "{name}"\nmetrics_url = "{engine.url}"\n'
            + "".join(f"{k} = {v}\n" for k, v in opts.items()))


def events_of(d, kind):
    return [e for e in d.events() if e["kind"] == kind]


def wait_event(d, kind, timeout=20):
    return wait_for(lambda: next(iter(events_of(d, kind)), None), timeout, interval=0.2, what=f"a {kind} event")


def test_a_stalled_engine_is_killed_with_its_whole_tree_orphans_included(daemon_factory, fake_engine):
    engine = fake_engine("progress", "--orphans", "--spin")
    assert len(engine.pids()) == 3  # engine, worker child, orphaned grandchild
    d = daemon_factory(engine_config(engine)).start()
    d.wait_serving()
    time.sleep(3)  # normal work: tokens move, requests complete
    assert not events_of(d, "engine_stall")
    engine.set_mode("stall")
    stalled_at = time.monotonic()
    killed = wait_event(d, "engine_killed")
    elapsed = time.monotonic() - stalled_at
    stall = events_of(d, "engine_stall")[0]
    figures = stall["evidence"]["figures"]
    assert figures["running"] == 2 and figures["threshold_seconds"] == MIN_STALL
    assert figures["stalled_seconds"] <= MIN_STALL + INTERVAL + 0.25  # threshold plus one scrape interval
    assert stall["evidence"]["spinning"] and "spins at" in stall["message"], json.dumps(stall)
    spinner = engine.pids()[-1]  # the child the stall started, the one process of the tree that spins
    assert stall["evidence"]["busiest"].startswith(f"pid {spinner} (python") and \
        f"pid {spinner} (python" in stall["message"], json.dumps(stall)  # the page says which one spins
    assert "killed fake" in killed["message"] and "(stalled)" in killed["message"]
    wait_for(lambda: not engine.alive(), 10, what="every process of the tree to be gone")
    print(f"stall to kill: {elapsed:.2f} s (threshold {MIN_STALL} s, interval {INTERVAL} s)")
    assert d.stop() == 0


def test_idle_and_slow_but_progressing_engines_are_never_killed(daemon_factory, fake_engine):
    idle, slow = fake_engine("idle"), fake_engine("slow")
    d = daemon_factory(engine_config(idle, "idle") + engine_config(slow, "slow")).start()
    d.wait_serving()
    time.sleep(4 * MIN_STALL)
    assert not events_of(d, "engine_stall") and not events_of(d, "engine_killed")
    assert idle.alive() == idle.pids() and slow.alive() == slow.pids()
    metrics = d.metrics()
    assert 'gpuwarden_engine_requests_running{engine="idle"} 0.0' in metrics
    assert 'gpuwarden_engine_requests_running{engine="slow"} 1.0' in metrics
    assert d.stop() == 0


def test_engines_are_scraped_at_whole_seconds_each_at_a_phase_of_its_own(daemon_factory, fake_engine, tmp_path):
    """runtime/ticks.py: the regular scrapes of engines at whole-second intervals come on the one-second grid of the
    monotonic clock, where the GPU round and the lag probe wake the loop too (each at a phase of its own, 32 engines
    woke it 6.4 times a second); the engines' phases still spread over the interval: at 2 s, the first and third
    engines' phases are 0 s, the second's 1 s (the first looks of each come at once, off the grid)."""
    logs = [tmp_path / f"scrapes-{i}" for i in range(3)]
    engines = [fake_engine("progress", "--scrapes", str(log)) for log in logs]
    d = daemon_factory("".join(engine_config(e, f"e{i}", scrape_interval='"2s"', min_stall='"30s"')
                               for i, e in enumerate(engines))).start()
    d.wait_serving()
    wait_for(lambda: all(log.exists() and len(log.read_text().split()) >= 6 for log in logs), 30,
             what="six scrapes of each engine")
    assert d.stop() == 0
    regular = [[float(t) for t in log.read_text().split()][-3:] for log in logs]
    # late by the loop's wake-up, the look's LOOK_FIRST at most and the request: never early
    late = [sorted(t % 1.0 for t in times)[len(times) // 2] for times in regular]
    assert all(lateness < 0.4 for lateness in late), (late, regular)
    parity = [Counter(int(t) % 2 for t in times).most_common(1)[0][0] for times in regular]
    assert parity[0] == parity[2] != parity[1], regular


def test_a_hung_metrics_is_asked_again_once_its_scrape_timed_out(daemon_factory, fake_engine, tmp_path):
    """A scrape that waits its whole timeout, as long as its interval (both 5 s by default), outlasts its tick: the
    next comes at once, not at the next grid point (a hung engine was asked half as often, and its failures in a row
    that make it unresponsive came half as fast)."""
    log = tmp_path / "scrapes"
    engine = fake_engine("progress", "--scrapes", str(log))
    d = daemon_factory(engine_config(engine, scrape_interval='"2s"', scrape_timeout='"2s"', min_stall='"30s"')).start()
    d.wait_serving()
    engine.set_mode("hang")
    hung = time.monotonic()
    wait_for(lambda: sum(float(t) > hung for t in log.read_text().split()) >= 5, 30, what="five scrapes of it hung")
    asked = [float(t) for t in log.read_text().split() if float(t) > hung]
    gaps = [b - a for a, b in itertools.pairwise(asked)]
    # its timeout (2 s), then the failure's own work (4 s apart before, every one): the median, as a machine under
    # load can hold up one failure's work (3.46 s seen once, beside 2.01 s for the others)
    assert statistics.median(gaps) < 3.0, gaps
    assert d.stop() == 0


def test_a_tree_that_ignores_sigterm_dies_by_sigkill(daemon_factory, fake_engine):
    engine = fake_engine("stall", "--ignore-term", "--orphans")
    d = daemon_factory(engine_config(engine)).start()
    killed = wait_event(d, "engine_killed")
    assert len(killed["evidence"]["killed"]) == 3 and killed["evidence"]["terminated"] == [], killed
    assert "needed SIGKILL" in killed["message"]
    wait_for(lambda: not engine.alive(), 10, what="the SIGTERM-proof tree to be gone")
    assert d.stop() == 0


def test_dry_run_kills_nothing(daemon_factory, fake_engine):
    engine = fake_engine("stall", "--orphans")
    d = daemon_factory(engine_config(engine, dry_run="true")).start()
    killed = wait_event(d, "engine_killed")
    assert killed["evidence"]["dry_run"] and killed["message"].startswith("dry run: would kill fake: 3 processes")
    time.sleep(2)
    assert engine.alive() == engine.pids()
    assert "gpuwarden_engine_kills_total" not in d.metrics()
    assert d.stop() == 0


def test_the_kill_budget_holds(daemon_factory, fake_engine, tmp_path):
    first = fake_engine("stall")
    d = daemon_factory(engine_config(first, kill_budget="1")).start()
    wait_event(d, "engine_killed")
    wait_for(lambda: not first.alive(), 10, what="the first engine to die")
    second = fake_engine("progress")  # the engine restarted, same port
    d.write_config(engine_config(second, kill_budget="1"))
    d.proc.send_signal(1)  # SIGHUP: the reload keeps the budget that was spent
    d.wait_log("reloaded")
    wait_event(d, "engine_back")  # the new instance is judged once it is back (a start's stall waits its deadline)
    stalled_again_is_refused(d, second)


def stalled_again_is_refused(d, engine) -> None:
    """The engine stalls again with its budget (1 kill) spent: refused, left running, still one kill in all."""
    engine.set_mode("stall")
    refused = wait_event(d, "kill_refused")
    assert "kill budget (1 per 3600 s) is spent" in refused["message"]
    assert engine.alive() == engine.pids()
    assert len(events_of(d, "engine_killed")) == 1
    assert d.stop() == 0


def test_the_kill_budget_outlives_a_restart_of_gpuwarden(daemon_factory, fake_engine):
    """A restart of gpuwarden (a crash, systemctl restart, an OOM kill) forgot the kills it had made: a daemon
    restarting in a loop beside a flapping engine killed it without bound. The kills within the window are read
    back from the store at the start."""
    first = fake_engine("stall")
    d = daemon_factory(engine_config(first, kill_budget="1")).start()
    wait_event(d, "engine_killed")
    wait_for(lambda: not first.alive(), 10, what="the first engine to die")
    assert d.stop() == 0  # SIGTERM
    d.start()  # the same state folder: the same store
    d.wait_serving()
    second = fake_engine("progress", port=first.port)  # its supervisor starts it again, on the same port
    wait_for(lambda: events_of(d, "engine_back"), 60, interval=0.2, what="the engine back")
    stalled_again_is_refused(d, second)


def append(d, text: str) -> None:
    with d.log_file.open("a") as log:
        log.write(text)


def fake_gpus(tmp_path, *bdfs) -> str:
    """A Radeon's sysfs tree (none is here) so that the daemon has seen these GPUs; the guard stays off."""
    root = build(tmp_path / "sys", dict.fromkeys(bdfs, "rdna3"))
    return f'[gpu]\nsysfs_root = "{root}"\nnvml = false\n[guard]\nenabled = false\n'


@pytest.mark.root
def test_sq_intr_names_no_owner_so_it_puts_the_engine_under_suspicion_and_its_stall_then_kills_it(
        daemon_factory, fake_engine, tmp_path):
    """sq_intr names no process (any ROCm user can raise one): the engine on that GPU is watched closely, not
    killed; the engine on another GPU is not even suspected. Once the suspect stops progressing it is killed
    at its floor (min_stall)."""
    mine, other = fake_engine("progress"), fake_engine("progress")
    config = (engine_config(mine, "mine", gpus=f'["{TEST_GPU}"]', canary='"off"')
              + engine_config(other, "other", gpus='["ffff:fe:1f.6"]', canary='"off"')
              + fake_gpus(tmp_path, TEST_GPU, "ffff:fe:1f.6"))
    d = daemon_factory(config).start()
    d.wait_serving()
    append(d, driver_record(f"amdgpu {TEST_GPU}: amdgpu: sq_intr: error, detail 0x00000000, type 1, sh 1"))
    suspect = wait_event(d, "engine_suspect")
    assert (suspect["engine"], suspect["severity"]) == ("mine", "warning")
    assert f"kernel reported sq_intr on {TEST_GPU} (no owner)" in suspect["message"]
    time.sleep(3 * MIN_STALL)  # progressing under suspicion: never killed
    assert not events_of(d, "engine_killed") and mine.alive() == mine.pids()
    assert [e["engine"] for e in events_of(d, "engine_suspect")] == ["mine"]
    mine.set_mode("stall")
    killed = wait_event(d, "engine_killed")
    assert killed["engine"] == "mine"
    stall = wait_event(d, "engine_stall")
    assert "under suspicion since kernel reported sq_intr" in stall["message"]
    assert stall["evidence"]["figures"]["stalled_seconds"] <= MIN_STALL + INTERVAL + 0.5  # the floor + one scrape
    wait_for(lambda: not mine.alive(), 10, what="the suspect engine to die")
    assert other.alive() == other.pids()
    assert d.stop() == 0


@pytest.mark.root
def test_a_fault_on_a_gpu_this_machine_never_had_kills_nothing(daemon_factory, fake_engine, tmp_path):
    """A line naming a GPU the daemon has not seen (a test suite's, a pasted log's) is alerted, not acted on."""
    engine = fake_engine("progress")
    d = daemon_factory(engine_config(engine, min_stall='"10m"') + fake_gpus(tmp_path, "ffff:fe:1f.6")).start()
    d.wait_serving()
    append(d, driver_record(f"amdgpu {TEST_GPU}: amdgpu: sq_intr: error, detail 0x00000000, type 1, sh 1"))
    assert wait_event(d, "sq_intr")["gpu"] == TEST_GPU
    time.sleep(1)
    assert not events_of(d, "engine_killed") and engine.alive() == engine.pids()
    assert not events_of(d, "engine_suspect")  # not even suspicion
    assert d.stop() == 0


def test_an_engine_that_stops_answering_is_unresponsive(daemon_factory, fake_engine):
    engine = fake_engine("progress")
    d = daemon_factory(engine_config(engine, scrape_timeout='"300ms"', on_stall='"alert"')).start()
    d.wait_serving()
    wait_for(lambda: 'gpuwarden_engine_up{engine="fake"} 1.0' in d.metrics(), 10, what="a first answer")
    engine.set_mode("hang")
    event = wait_event(d, "engine_unresponsive")
    assert "has not answered /metrics for" in event["message"] and "timeout" in event["message"]
    assert event["evidence"]["figures"]["silent_seconds"] >= MIN_STALL  # as long as a stall takes
    assert event["evidence"]["requests_running"] == 2 and event["severity"] == "critical"
    killed = wait_event(d, "engine_killed")  # on_unresponsive = "kill" by default: requests were running
    assert "(unresponsive with requests running)" in killed["message"]
    assert 'gpuwarden_engine_scrape_failures_total{engine="fake",reason="timeout"}' in d.metrics()
    assert d.stop() == 0


def test_a_configured_engine_that_does_not_answer_is_said_once_and_again_when_it_answers(daemon_factory, fake_engine):
    """Nothing serves the URL (a wrong port, an engine not started yet): no process lives there, so it is never
    engine_unresponsive, and without this line the log said nothing at all about the engine."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    d = daemon_factory(f'[[engine]]\nname = "late"\nmetrics_url = "{url}"\nscrape_interval = "{INTERVAL}s"\n').start()
    d.wait_log("engine late: cannot read its progress from /metrics (3 tries, last: refused")
    time.sleep(4 * INTERVAL)
    assert d.log().count("engine late: cannot read") == 1
    fake_engine("progress", port=port)
    d.wait_log("engine late: /metrics answers again")
    assert d.stop() == 0


def test_nvml_off_is_off_for_the_engines_too(daemon_factory, fake_engine):
    """[gpu] nvml = false (say, where NVML hangs) kept the GPU reader off, but the engine watch still loaded NVML
    to map the engine's processes to GPUs. No NVIDIA driver here: loading it logs "NVML not available"."""
    engine = fake_engine("progress")
    d = daemon_factory(engine_config(engine) + "[gpu]\nnvml = false\n").start()
    d.wait_serving()
    wait_for(lambda: 'gpuwarden_engine_cpu_ratio{engine="fake"}' in d.metrics(), 15,
             what="the engine's processes looked at")
    assert "NVML" not in d.log()
    assert d.stop() == 0


def test_an_engine_hung_before_the_daemon_came_is_unresponsive_but_not_killed(daemon_factory, fake_engine):
    """It never answered: silence counts from the first try, and with nothing known to be running it is only
    reported."""
    engine = fake_engine("progress")
    engine.set_mode("hang")
    d = daemon_factory(engine_config(engine, scrape_timeout='"300ms"')).start()
    d.wait_serving()
    event = wait_event(d, "engine_unresponsive")
    assert "it has never answered" in event["message"] and event["severity"] == "warning"
    time.sleep(2 * MIN_STALL)
    assert not events_of(d, "engine_killed") and engine.alive() == engine.pids()
    assert d.stop() == 0


def test_exits_and_a_crash_loop_quarantine_the_poisoned_cache(daemon_factory, fake_engine, tmp_path):
    engine = fake_engine("progress")
    port = engine.port
    d = daemon_factory(engine_config(engine, crash_loop_exits="3", unresponsive_after="100"))
    inductor = d.caches / "inductor"
    (inductor / "fx").mkdir(parents=True)
    (inductor / "fx" / "kernel.py").write_text("# compiled\n")
    for name in ("a.so", "b.json"):
        (inductor / "fx" / name).touch()  # cut by a power loss
    d.start()
    d.wait_serving()
    for exits in range(1, 4):
        time.sleep(1.5)
        engine.kill()  # it dies by itself, as far as gpuwarden knows
        wait_for(lambda n=exits: len(events_of(d, "engine_exited")) == n, 10, what="an engine_exited event")
        engine = fake_engine("progress", port=port)  # restarted on the same port
    loop = wait_event(d, "engine_crash_loop")
    assert "exited 3 times" in loop["message"]
    moved = wait_event(d, "cache_poisoned")
    [broken] = d.caches.parent.glob("cache.BROKEN-*-crash_loop")
    assert not d.caches.exists()
    assert sorted(p.name for p in (broken / "inductor/fx").iterdir()) == ["a.so", "b.json", "kernel.py"]
    assert moved["evidence"]["moved"][0]["zero_byte_files"] == 2 and str(broken) in moved["message"]
    assert d.stop() == 0


def test_discovery_finds_a_running_engine_server(daemon_factory, fake_engine):
    engine = fake_engine("progress", "vllm", "serve", "Qwen/Qwen3-0.6B")
    d = daemon_factory("[engines]\ndiscover_interval = \"1s\"\n").start()
    d.wait_log(f"discovered vllm serving on port {engine.port}")
    wait_for(lambda: f'gpuwarden_engine_up{{engine="vllm-{engine.port}"}} 1.0' in d.metrics(), 15,
             what="the discovered engine's metrics")
    assert d.stop() == 0


def test_probe_reports_a_live_engine(fake_engine):
    engine = fake_engine("progress", dump="sglang-01.prom", profile="sglang")
    out = subprocess.run([*GPUWARDEN, "probe", "--json", engine.url], capture_output=True, text=True, timeout=30)
    report = json.loads(out.stdout)
    assert out.returncode == 0 and report["up"] and report["profile"] == "sglang"
    assert report["running"] == 2.0 and report["waiting"] == 0.0 and report["generated_tokens"] >= 1000


def test_probe_fails_when_the_engine_is_down():
    url = f"http://127.0.0.1:{free_port()}/metrics"  # nothing listens there
    out = subprocess.run([*GPUWARDEN, "probe", "--json", url], capture_output=True, text=True, timeout=30)
    report = json.loads(out.stdout)
    assert out.returncode == 1 and not report["up"] and report["error"].startswith("refused")


def test_discovery_watches_at_most_max_discovered_and_says_once_which_it_skips(daemon_factory, fake_engine):
    """Anyone can start servers that look like engines on loopback, and root scrapes each one it watches:
    past [engines] max_discovered, the rest are skipped and named once in the log. Other engines on this host
    (another test's) may be discovered too: the cap holds whatever they are."""
    engines = [fake_engine("progress", "vllm", "serve", "Qwen/Qwen3-0.6B") for _ in range(3)]
    d = daemon_factory('[engines]\ndiscover_interval = "1s"\nmax_discovered = 2\n').start()
    d.wait_log("max_discovered (2) watches; not watching", timeout=20)

    def watched() -> list[str]:
        return re.findall(r'^gpuwarden_engine_up\{engine="([^"]+)"\} ', d.metrics(), re.M)
    wait_for(lambda: len(watched()) == 2, 15, what="two engines watched")
    time.sleep(3)  # three more discovery rounds
    assert len(watched()) == 2, watched()
    skipped = [e.port for e in engines if f"vllm-{e.port}" not in watched()]
    assert skipped and all(d.log().count(f"vllm-{port} (pid ") == 1 for port in skipped)  # once, not each round
    assert d.stop() == 0


def probe_canary(*args: str) -> tuple[int, dict, str]:
    out = subprocess.run([*GPUWARDEN, *args, "--json", "--canary"], capture_output=True, text=True, timeout=30)
    return out.returncode, json.loads(out.stdout) if out.returncode != 78 else {}, out.stdout + out.stderr


def test_probe_canary_says_what_a_keyed_engine_needs_and_never_prints_the_key(fake_engine, tmp_path,
                                                                               monkeypatch):
    key = f"gwtest-probe-{time.time_ns()}"
    on_its_command_line = fake_engine("progress", "--api-key", key)
    code, report, said = probe_canary("probe", on_its_command_line.url)
    assert code == 0 and report["canary"] == "ok", report
    assert "from its command line (--api-key)" in report["canary_detail"] and key not in said

    monkeypatch.setenv("VLLM_API_KEY", key)
    in_its_environment = fake_engine("progress")  # as vLLM reads $VLLM_API_KEY: nothing the canary can see
    code, report, said = probe_canary("probe", in_its_environment.url)
    assert code == 1 and report["canary"] == "misconfigured", report
    assert "HTTP 401" in report["canary_detail"] and "canary_api_key_file" in report["canary_detail"], report

    key_file = tmp_path / "keyed.key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o644)
    config = tmp_path / "gpuwarden.toml"
    config.write_text(f'[[engine]]\nname = "keyed"\nmetrics_url = "{in_its_environment.url}"\n'
                      f'canary_api_key_file = "{key_file}"\n')
    code, _, said = probe_canary("--config", str(config), "probe", "--engine", "keyed")
    assert code == 78 and "open to others (mode 644)" in said and key not in said, said  # others may read it
    key_file.chmod(0o600)
    code, report, said = probe_canary("--config", str(config), "probe", "--engine", "keyed")
    assert code == 0 and report["canary"] == "ok" and key not in said, report
