"""`gpuwarden reload --pid PID` (the unit's ExecReload) returns only once the daemon has re-read its configuration:
`systemctl reload && curl` sees the new one. Real daemon processes, real signals, the real confirmation file."""

import json
import signal
import subprocess
import sys
import time

from helpers import GPUWARDEN, free_port, http_get

from gpuwarden.runtime import reloads


def reload(pid: int, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUWARDEN, "reload", "--pid", str(pid), "--timeout", str(timeout)],
                          capture_output=True, text=True, timeout=timeout + 10)


def test_reload_returns_once_the_new_config_serves_and_names_a_bad_one(daemon_factory):
    d = daemon_factory().start()
    d.wait_serving()
    old_port, d.port = d.port, free_port()
    d.write_config()  # the exporter moves to a new port: visible the moment the reload is done
    done = reload(d.proc.pid)
    assert done.returncode == 0, done.stderr
    assert "reloaded" in done.stdout and str(d.config_path) in done.stdout
    assert "gpuwarden_build_info" in d.metrics()  # at once: no waiting, no retry
    try:
        http_get(f"http://127.0.0.1:{old_port}/metrics", timeout=1)
        raise AssertionError("the old port still answers")
    except OSError:
        pass

    d.write_config('storm_window = "soon"\n')
    done = reload(d.proc.pid)
    assert done.returncode == 78, done
    assert "kernel.storm_window: bad duration 'soon'" in done.stderr and "running configuration stays" in done.stderr
    assert "gpuwarden_build_info" in d.metrics()  # still serving on the configuration before
    record = json.loads((d.state / reloads.FILE).read_text())
    assert record["pid"] == d.proc.pid and not record["ok"]
    assert (d.state / reloads.FILE).stat().st_mode & 0o777 == 0o600
    assert d.stop() == 0


def test_an_earlier_reload_is_no_confirmation_and_the_wait_is_bounded(tmp_path):
    """A process that holds a gpuwarden.db and ignores SIGHUP, with the confirmation of an earlier reload of its
    own pid in its state dir: `gpuwarden reload` does not take that one, and gives up after its timeout."""
    db = tmp_path / reloads.DB
    script = tmp_path / "gpuwarden"  # it must look like `gpuwarden run` to be signalled at all
    script.write_text("import signal, sys, time\nsignal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
                      f"f = open({str(db)!r}, 'a')\nprint('ready', flush=True)\ntime.sleep(60)\n")
    tmp_path.chmod(0o700)
    deaf = subprocess.Popen([sys.executable, str(script), "run"], stdout=subprocess.PIPE, text=True)
    try:
        assert deaf.stdout.readline() == "ready\n"
        reloads.confirm(tmp_path, deaf.pid, time.clock_gettime_ns(time.CLOCK_MONOTONIC), None, "earlier")
        start = time.monotonic()
        done = reload(deaf.pid, timeout=2)
        assert done.returncode == 1 and "did not confirm the reload within 2 s" in done.stderr, done
        assert 2 <= time.monotonic() - start < 8
        assert deaf.poll() is None
    finally:
        deaf.kill()
        deaf.wait()


def test_a_process_that_is_no_gpuwarden_is_not_signalled():
    other = subprocess.Popen(["sleep", "60"])  # SIGHUP would end it
    try:
        time.sleep(0.1)
        done = reload(other.pid, timeout=2)
        assert done.returncode == 1 and "is not a gpuwarden daemon" in done.stderr, done
        time.sleep(0.2)
        assert other.poll() is None
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait()
