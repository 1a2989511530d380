"""The reload confirmation: only a reload of that daemon that began after the signal answers it."""

import os
import time

import pytest

from gpuwarden.runtime import reloads


def test_only_a_reload_of_that_pid_begun_after_the_signal_answers():
    asked = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    assert reloads.answers({"pid": 7, "began_ns": asked, "ok": True}, 7, asked)
    assert reloads.answers({"pid": 7, "began_ns": asked + 1, "ok": False}, 7, asked)
    assert not reloads.answers({"pid": 7, "began_ns": asked - 1, "ok": True}, 7, asked)  # an earlier reload
    assert not reloads.answers({"pid": 8, "began_ns": asked + 1, "ok": True}, 7, asked)  # an earlier daemon
    assert not reloads.answers(None, 7, asked)
    assert not reloads.answers({}, 7, asked)


def test_the_confirmation_is_replaced_whole_and_private(tmp_path):
    old = os.umask(0o022)  # a umask that would leave a plain file readable by others
    try:
        reloads.confirm(tmp_path, 7, 1, None, "a.toml")
        reloads.confirm(tmp_path, 7, 2, "kernel.storm_window: bad duration", None)
    finally:
        os.umask(old)
    record = reloads.read(tmp_path)
    assert (record["pid"], record["began_ns"], record["ok"], record["error"]) == (
        7, 2, False, "kernel.storm_window: bad duration")
    assert [p.name for p in tmp_path.iterdir()] == [reloads.FILE]  # no temporary file left
    assert (tmp_path / reloads.FILE).stat().st_mode & 0o777 == 0o600


def test_the_state_dir_is_where_the_daemon_holds_its_database(tmp_path):
    with open(tmp_path / reloads.DB, "a"):
        assert reloads.database_dir(os.getpid()) == tmp_path
    with pytest.raises(LookupError, match="is not a gpuwarden daemon"):
        reloads.database_dir(os.getpid())


def test_a_process_holding_a_gpuwarden_db_is_no_proof_of_a_daemon(tmp_path):
    """Issue 24: any process with an open file named gpuwarden.db passed for the daemon (pytest is not one)."""
    with open(tmp_path / reloads.DB, "a"), pytest.raises(LookupError, match="command line is not `gpuwarden run`"):
        reloads.state_dir_of(os.getpid())


def test_a_failed_reload_always_says_why():
    assert reloads.reason(TimeoutError()).startswith("reading the configuration did not finish in time")
    assert reloads.reason(RuntimeError()) == "RuntimeError"
    assert reloads.reason(ValueError("bad")) == "bad"
