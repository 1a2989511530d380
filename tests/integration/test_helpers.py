"""The test suite's own parts (helpers.py, tests/conftest.py), where a mistake would make other tests pass or
fail wrongly."""

import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_a_restarted_daemon_is_waited_for_on_its_own_lines_not_the_last_runs(daemon_factory):
    """A restart appends to the same log: the first run's "gpuwarden running" must not answer for the second
    (it did, and the test stopped a daemon that had no SIGTERM handler yet: rc -15). The second run here is a
    process that exits without writing it: the wait says so instead of returning."""
    d = daemon_factory().start()
    d.wait_serving()
    assert d.stop() == 0
    assert "gpuwarden running" in d.log()

    d.start(sys.executable, "-c", "import sys; print('not a daemon', file=sys.stderr)")  # runs instead of it
    try:
        d.wait_log("gpuwarden running")
    except AssertionError as exc:
        assert "the daemon exited 0 without writing 'gpuwarden running'" in str(exc)
    else:
        raise AssertionError("the first run's line answered for the second")
    assert d.stop() == 0 and d.log().endswith("not a daemon\n")


@pytest.mark.root
def test_any_skip_as_root_fails_the_run(tmp_path):
    """CI runs as root: a test that skips there (not only one marked `root`), or a module that skips whole,
    fails the run with its reason; an expected failure (xfail) is no skip."""
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\n"
        "def test_runs():\n    pass\n\n"
        "def test_skips():\n    pytest.skip('no such device here')\n\n"
        "@pytest.mark.skipif(True, reason='not on this host')\n"
        "def test_skipped_by_mark():\n    pass\n\n"
        "@pytest.mark.xfail(reason='a known bug', strict=True)\n"
        "def test_known_bug():\n    assert False\n")
    (tmp_path / "test_module_skips.py").write_text(
        "import pytest\n\npytest.skip('no engine on this host', allow_module_level=True)\n")
    tests = Path(__file__).parents[1]
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q",
                             "-rA", "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path)],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(tests)})
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    # a skip in the test, one in its set-up (an error), the module's: counted as skipped, then failing the run
    assert "1 failed, 1 passed, 1 skipped, 1 xfailed, 1 error" in out, out
    for reason in ("no such device here", "not on this host"):
        assert f"skipped while running as root (CI must run every test): Skipped: {reason}" in out, out
    assert "modules skipped while running as root" in out and \
           "FAILED test_module_skips.py: Skipped: no engine on this host" in out, out


def test_waiting_for_progress_waits_for_the_daemons_tokens_to_move_and_fails_on_flat_ones():
    """wait_progress replaces the fixed sleeps before a stall: it returns once the daemon's exported tokens have
    moved, and a flat counter (or an engine the daemon does not export) is a timeout, never a pass."""
    from helpers import wait_progress

    readings = iter([10.0, 10.0, 12.0])
    series = 'gpuwarden_engine_generated_tokens_total{engine="fake"} '
    wait_progress(lambda: f"# HELP x\n{series}{next(readings)}\n", "fake", timeout=5)
    with pytest.raises(AssertionError, match="fake's tokens move"):
        wait_progress(lambda: f"{series}10.0\n", "fake", timeout=0.5)
    with pytest.raises(AssertionError, match="other's tokens move"):
        wait_progress(lambda: f"{series}10.0\n{series}11.0\n", "other", timeout=0.5)


def test_free_ports_come_from_below_the_ephemeral_range_each_once():
    """free_port's bind race: a port the kernel chose for port 0 can be taken as a connection's source port
    before the test's server binds it; ports below ip_local_port_range never are, and none is handed out twice."""
    from helpers import free_port

    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50 and all(1024 <= port < ephemeral for port in ports), ports
