"""The pure judgements behind `gpuwarden npd-check` (the command itself: tests/integration/test_npd.py)."""

import threading

from gpuwarden.cli import npd

BOOT = 1_700_000_000.0


def row(condition, subject, *causes, t=BOOT + 60):
    """An open condition as npd.read_conditions gives it."""
    return {"time": t, "condition": condition, "subject": subject, "gpu": None, "engine": None,
            "causes": list(causes)}


def test_a_gpu_lost_this_boot_is_a_problem_and_one_of_the_last_boot_is_not():
    assert npd.judge_gpu([], BOOT)[0] == npd.OK
    assert npd.judge_gpu([row("gpu_lost", "0000:03:00.0", "device_lost", t=BOOT - 1)], BOOT)[0] == npd.OK
    code, text = npd.judge_gpu([row("gpu_lost", "0000:03:00.0", "reset_failed"),
                                row("gpu_lost", "0000:04:00.0", "gpu_missing")], BOOT)
    assert code == npd.PROBLEM
    assert text.startswith("reset_failed 0000:03:00.0 at ") and text.endswith("(+1 more): reboot")


def test_only_gpu_lost_counts_for_the_gpu():
    assert npd.judge_gpu([row("gpu_degraded", "thermal:0000:03:00.0:junction", "thermal")], BOOT)[0] == npd.OK
    assert npd.judge_gpu([row("engine_down", "vllm", "engine_exited")], BOOT)[0] == npd.OK


def test_an_engine_problem_counts_while_gpuwarden_could_not_fix_it():
    assert npd.judge_engine([]) == (npd.OK, "no engine problem left unfixed")
    being_restarted = [row("engine_down", "vllm", "engine_killed"),
                       row("engine_restarting", "vllm", "engine_restarting")]
    assert npd.judge_engine(being_restarted)[0] == npd.OK  # our own kill, and its restart under way
    assert npd.judge_engine([row("engine_restarting", "vllm", "engine_restarting")])[0] == npd.OK
    assert npd.judge_engine([row("engine_stalled", "vllm", "engine_stall")])[0] == npd.PROBLEM
    assert npd.judge_engine([row("engine_down", "vllm", "engine_killed", "engine_crash_loop")])[0] == npd.PROBLEM
    code, text = npd.judge_engine([row("engine_unresponsive", "sglang", "engine_unresponsive", t=BOOT + 50),
                                   row("engine_down", "vllm", "engine_exited", t=BOOT + 70)])
    assert code == npd.PROBLEM and text.startswith("engine vllm: engine_down at ") and text.endswith("(+1 more)")


def test_an_engine_killed_and_not_being_restarted_is_a_problem():
    """Issue 36: killed with on_stall = "kill" (or its restart refused), nothing of gpuwarden's brings it back,
    while `gpuwarden conditions` lists it down: NPD must hear it."""
    killed = row("engine_down", "qwen-72b", "engine_killed", t=BOOT + 70)
    code, text = npd.judge_engine([killed])
    assert code == npd.PROBLEM and text.startswith("engine qwen-72b: engine_down at ")
    assert text.endswith(", not restarted")
    # another engine's restart under way does not count for this one
    assert npd.judge_engine([killed, row("engine_restarting", "vllm", "engine_restarting")])[0] == npd.PROBLEM


def test_a_failed_restart_is_a_problem_until_the_engine_is_back():
    killed = [row("engine_down", "vllm", "engine_killed", t=BOOT + 70),
              row("engine_restarting", "vllm", "engine_restarting", t=BOOT + 71)]  # being dealt with
    assert npd.judge_engine(killed)[0] == npd.OK
    failed = row("engine_down", "vllm", "engine_killed", "engine_restart_failed", t=BOOT + 80)
    assert npd.judge_engine([failed])[0] == npd.PROBLEM
    assert npd.judge_engine([])[0] == npd.OK  # engine_back resolved the condition: it is no longer open


def test_the_daemon_is_judged_by_its_own_metrics():
    healthy = ('gpuwarden_build_info{version="0.1.0"} 1.0\n'
               'gpuwarden_component_up{component="kernel"} 1.0\ngpuwarden_component_up{component="gpus"} 1.0\n'
               "gpuwarden_store_writable 1.0\n")
    assert npd.judge_daemon(healthy)[0] == npd.OK
    assert npd.judge_daemon('node_load1 0.5\n')[0] == npd.UNKNOWN  # another exporter on the port
    assert npd.judge_daemon(healthy.replace('"gpus"} 1.0', '"gpus"} 0.0')) == (
        npd.PROBLEM, "gpuwarden component failing: gpus")
    assert npd.judge_daemon(healthy.replace("writable 1.0", "writable 0.0"))[0] == npd.PROBLEM


def test_messages_are_one_line_of_at_most_80_bytes():
    assert npd.message("a\nb  c") == "a b c"
    long = npd.message("é" * 100)
    assert len(long.encode()) <= npd.MAX_MESSAGE and long == "é" * 40


def test_the_exporter_is_asked_on_loopback_for_a_wildcard_listen():
    assert npd.metrics_url("0.0.0.0", 10440) == "http://127.0.0.1:10440/metrics"
    assert npd.metrics_url("::", 10440) == "http://[::1]:10440/metrics"
    assert npd.metrics_url("10.0.0.5", 1) == "http://10.0.0.5:1/metrics"


def test_a_check_that_hangs_is_unknown_in_time_and_one_that_raises_is_unknown():
    release = threading.Event()
    hung = npd.bounded(lambda: release.wait(60) and (0, "late"), 0.2)
    assert hung == (npd.UNKNOWN, "unknown: no answer within 0.2 s")
    release.set()

    def broken():
        raise LookupError("no store at /x")
    assert npd.bounded(broken, 5) == (npd.UNKNOWN, "unknown: no store at /x")


def test_the_open_conditions_are_read_from_the_daemon_s_store(tmp_path):
    """What the hub stored: a raise, a raise and its resolution; only the open one is read, with its causes."""
    from gpuwarden.core import conditions
    from gpuwarden.core.model import Event, Severity
    from gpuwarden.store.sqlite import Store

    db = tmp_path / "gpuwarden.db"
    store = Store(db)
    lost = Event("device_lost", Severity.CRITICAL, "lost", BOOT + 5, gpu="0000:03:00.0")
    stall = Event("engine_stall", Severity.CRITICAL, "stalled", BOOT + 9, engine="vllm")
    killed = Event("engine_killed", Severity.CRITICAL, "killed", BOOT + 10, engine="vllm")
    state: dict = {}
    for event in (lost, stall, killed):
        state, changes = conditions.apply(state, event)
        store.add_changes(changes)
    store.close()
    rows = npd.read_conditions(db, 1.0)
    assert [(r["condition"], r["subject"], r["causes"]) for r in rows] == [
        ("gpu_lost", "0000:03:00.0", ["device_lost"]), ("engine_down", "vllm", ["engine_killed"])]
    assert npd.judge_gpu(rows, BOOT)[0] == npd.PROBLEM and npd.judge_engine(rows)[0] == npd.PROBLEM
