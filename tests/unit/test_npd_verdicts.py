"""The pure judgements behind `gpuwarden npd-check` (the command itself: tests/integration/test_npd.py)."""

import threading

from gpuwarden import npd

BOOT = 1_700_000_000.0


def row(kind, severity="critical", t=BOOT + 60, gpu=None, engine=None, **evidence):
    return {"time": t, "kind": kind, "severity": severity, "gpu": gpu, "engine": engine, "evidence": evidence}


def test_a_gpu_lost_this_boot_is_a_problem_and_one_of_the_last_boot_is_not():
    assert npd.judge_gpu([], BOOT)[0] == npd.OK
    assert npd.judge_gpu([row("device_lost", t=BOOT - 1, gpu="0000:03:00.0")], BOOT)[0] == npd.OK
    code, text = npd.judge_gpu([row("reset_failed", gpu="0000:03:00.0"), row("gpu_missing", gpu="0000:04:00.0")],
                               BOOT)
    assert code == npd.PROBLEM
    assert text.startswith("reset_failed 0000:03:00.0 at ") and text.endswith("(+1 more): reboot")


def test_only_live_critical_losses_count():
    assert npd.judge_gpu([row("xid", severity="warning", gpu="0000:03:00.0")], BOOT)[0] == npd.OK
    assert npd.judge_gpu([row("ring_timeout", gpu="0000:03:00.0")], BOOT)[0] == npd.OK  # the engine is killed
    history = row("device_lost", gpu="0000:03:00.0", history="logged before gpuwarden started")
    assert npd.judge_gpu([history], BOOT)[0] == npd.OK
    assert npd.judge_gpu([row("xid", gpu="0000:03:00.0", xid=79)], BOOT)[0] == npd.PROBLEM


def test_an_engine_problem_counts_until_a_clean_kill_fixes_it():
    stall = row("engine_stall", engine="vllm")
    assert npd.judge_engine([stall], BOOT)[0] == npd.PROBLEM
    assert npd.judge_engine([stall], BOOT + 120)[0] == npd.OK  # older than the window
    killed = row("engine_killed", severity="warning", t=BOOT + 70, engine="vllm")
    assert npd.judge_engine([stall, killed], BOOT) == (npd.OK, "no engine problem left unfixed")
    dry = row("engine_killed", severity="warning", t=BOOT + 70, engine="vllm", dry_run=True)
    assert npd.judge_engine([stall, dry], BOOT)[0] == npd.PROBLEM
    survivors = row("engine_killed", t=BOOT + 70, engine="vllm", survivors=[123])
    code, text = npd.judge_engine([stall, survivors, row("kill_refused", t=BOOT + 50, engine="sglang")], BOOT)
    assert code == npd.PROBLEM and text.startswith("engine vllm: engine_killed at ") and text.endswith("(+1 more)")


def test_a_critical_clean_kill_fixes_a_failed_restart_is_a_problem_until_the_engine_is_back():
    stall = row("engine_stall", engine="vllm")
    killed = row("engine_killed", t=BOOT + 70, engine="vllm")  # critical: a production engine is down
    assert npd.judge_engine([stall, killed], BOOT)[0] == npd.OK
    failed = row("engine_restart_failed", t=BOOT + 80, engine="vllm")
    assert npd.judge_engine([stall, killed, failed], BOOT)[0] == npd.PROBLEM
    back = row("engine_back", severity="info", t=BOOT + 90, engine="vllm")
    assert npd.judge_engine([stall, killed, failed, back], BOOT)[0] == npd.OK


def test_the_daemon_is_judged_by_its_own_metrics():
    healthy = ('gpuwarden_build_info{version="0.1.0"} 1.0\n'
               'gpuwarden_component_up{component="kernel"} 1.0\ngpuwarden_component_up{component="gpus"} 1.0\n'
               "gpuwarden_store_writable 1.0\n")
    assert npd.judge_daemon(healthy)[0] == npd.OK
    assert npd.judge_daemon('node_load1 0.5\n')[0] == npd.UNKNOWN  # another exporter on the port
    assert npd.judge_daemon(healthy.replace('"gpus"} 1.0', '"gpus"} 0.0')) == (
        npd.PROBLEM, "gpuwarden component(s) failing: gpus")
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


def test_the_store_is_asked_only_for_the_conditions_kinds(tmp_path):
    """A big store is mostly other kinds (AER, page faults): they are left in SQLite, never decoded (a row
    whose evidence is not JSON would fail the read if it were), and the verdicts are the same."""
    import sqlite3
    from contextlib import closing

    from gpuwarden.store import Store

    db = tmp_path / "gpuwarden.db"
    Store(db).close()
    with closing(sqlite3.connect(db)) as conn, conn:  # closed too: an open db would pass this process for a daemon
        insert = ("INSERT INTO events (time, kind, severity, gpu, engine, message, evidence, dedupe_key)"
                  " VALUES (?, ?, ?, ?, ?, '', ?, '')")
        conn.executemany(insert, [(BOOT + i, "aer_corrected", "warning", "0000:03:00.0", None, "not json")
                                  for i in range(1, 2000)])
        conn.execute(insert, (BOOT + 5, "device_lost", "critical", "0000:03:00.0", None, "{}"))
        conn.execute(insert, (BOOT + 9, "engine_stall", "critical", None, "vllm", "{}"))
    gpu = npd.read_events(db, BOOT, 1.0, npd.GPU_LOST_KINDS)
    assert [r["kind"] for r in gpu] == ["device_lost"] and npd.judge_gpu(gpu, BOOT)[0] == npd.PROBLEM
    engine = npd.read_events(db, BOOT, 1.0, npd.ENGINE_KINDS)
    assert [(r["kind"], r["engine"]) for r in engine] == [("engine_stall", "vllm")]
    assert npd.read_events(db, BOOT + 6, 1.0, npd.GPU_LOST_KINDS) == []  # and only since `since`
