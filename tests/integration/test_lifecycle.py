"""The real daemon process: sd_notify, watchdog, signals, reload, exit codes."""

import re
import signal
import socket
import subprocess
import time
import urllib.request

import pytest
from helpers import GPUWARDEN, free_port, wait_for


def test_ready_watchdog_status_and_stopping(daemon_factory, notify_socket):
    d = daemon_factory(env={"NOTIFY_SOCKET": notify_socket.path, "WATCHDOG_USEC": "1000000"}).start()
    ready = notify_socket.wait("READY=1")
    first = notify_socket.wait("WATCHDOG=1", after=ready)
    notify_socket.wait("WATCHDOG=1", after=first + 1, timeout=3)  # pings keep coming, every 0.5 s
    status = notify_socket.messages[notify_socket.wait("STATUS=kernel source file; 0 GPUs; ")]
    up, total = re.search(r"(\d+)/(\d+) components up", status).groups()
    assert up == total and "down" not in status, status
    assert "found no GPUs" in d.log() and "kernel source: file" in d.log()
    assert "gpuwarden_build_info" in d.wait_serving()
    start = time.monotonic()
    assert d.stop(signal.SIGTERM) == 0
    assert time.monotonic() - start < 5
    notify_socket.wait("STOPPING=1", timeout=1)


def test_sigint_stops_cleanly(daemon_factory):
    d = daemon_factory().start()
    d.wait_serving()
    assert d.stop(signal.SIGINT) == 0


def test_reload_with_a_good_and_then_a_bad_config(daemon_factory, notify_socket):
    d = daemon_factory(env={"NOTIFY_SOCKET": notify_socket.path}).start()
    ready = notify_socket.wait("READY=1")
    d.wait_serving()

    d.write_config("storm_window = \"5s\"\n")
    d.proc.send_signal(signal.SIGHUP)
    reloading = notify_socket.wait("RELOADING=1", after=ready + 1)
    assert "MONOTONIC_USEC=" in notify_socket.messages[reloading]
    notify_socket.wait("READY=1", after=reloading + 1)
    d.wait_log("reloaded")

    d.write_config("storm_window = \"soon\"\n")
    d.proc.send_signal(signal.SIGHUP)
    reloading = notify_socket.wait("RELOADING=1", after=reloading + 1)
    failed = notify_socket.wait("STATUS=reload failed, old configuration kept", after=reloading + 1)
    notify_socket.wait("READY=1", after=failed)
    d.wait_log("kernel.storm_window: bad duration 'soon'")
    assert d.proc.poll() is None
    assert "gpuwarden_component_up" in d.metrics()  # still serving on the old configuration
    assert d.stop() == 0


@pytest.mark.parametrize(("config", "names"), [
    ('[exporter]\nport = "high"\n', "exporter.port"),
    ("[kernel]\nsorce = \"kmsg\"\n", "kernel.sorce: unknown key (did you mean 'source'?)"),
    ('[daemon]\nloop_lag_warn = "1 sec"\n', "daemon.loop_lag_warn: bad duration"),
])
def test_bad_configs_exit_78_and_name_the_key(tmp_path, config, names):
    path = tmp_path / "bad.toml"
    path.write_text(config)
    for command in ("run", "check"):
        result = subprocess.run([*GPUWARDEN, "--config", str(path), command], capture_output=True, text=True,
                                timeout=30)
        assert result.returncode == 78, result.stderr
        assert f"{path}:" in result.stderr and names in result.stderr


def test_unreadable_config_exits_78(tmp_path):
    result = subprocess.run([*GPUWARDEN, "--config", str(tmp_path), "run"], capture_output=True, text=True)
    assert result.returncode == 78
    assert "cannot read" in result.stderr


def test_check_prints_the_effective_config_and_usage_errors_exit_2(tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text("[kernel]\nstorm_window = \"3s\"\n")
    result = subprocess.run([*GPUWARDEN, "--config", str(path), "check", "--show"], capture_output=True, text=True)
    assert result.returncode == 0 and '"storm_window": 3.0' in result.stdout
    assert subprocess.run([*GPUWARDEN, "frobnicate"], capture_output=True).returncode == 2
    assert subprocess.run([*GPUWARDEN, "--version"], capture_output=True, text=True).stdout.startswith("gpuwarden ")


def test_a_store_that_cannot_be_opened_is_a_runtime_failure(daemon_factory):
    d = daemon_factory()
    d.state.mkdir()
    (d.state / "gpuwarden.db").write_bytes(b"garbage" * 1000)
    d.start()
    assert d.proc.wait(15) == 1
    assert "database is corrupt" in d.log()


def test_a_taken_exporter_port_names_the_address_and_the_keys(daemon_factory):
    """As when `make run` meets the installed service on 10440: "Address already in use" alone said not which."""
    d = daemon_factory()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", d.port))
        taken.listen()
        d.start()
        assert d.proc.wait(15) == 1
    assert (f"cannot serve metrics on 127.0.0.1:{d.port} ([exporter] listen and port; another gpuwarden?): "
            "Address already in use") in d.log()


def test_an_ipv6_listen_is_logged_as_a_url_that_answers(tmp_path):
    """`listen = "[::1]:PORT"`: the log said http://::1:PORT/metrics, which no browser or curl takes."""
    port, log = free_port(), tmp_path / "kern.log"
    log.touch()
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}/state"\n[exporter]\nlisten = "[::1]:{port}"\n'
                   f'[guard]\nenabled = false\n[kernel]\nsource = "file"\nfile = "{log}"\n')
    stderr = tmp_path / "stderr.log"
    with stderr.open("wb") as err:
        proc = subprocess.Popen([*GPUWARDEN, "--config", str(cfg), "run"], stdout=subprocess.DEVNULL, stderr=err)
    try:
        url = wait_for(lambda: (m := re.search(r"serving metrics on (\S+)", stderr.read_text())) and m.group(1), 15,
                       what="the serving line")
        assert url == f"http://[::1]:{port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            assert b"gpuwarden_build_info" in answer.read()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
