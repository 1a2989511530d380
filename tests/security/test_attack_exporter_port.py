"""Issue 38, "a daemon nobody can impersonate": a user holds the exporter's (unprivileged) port while gpuwarden
restarts. Before: one log line, no event, no alert; root's `gpuwarden status` showed the user's "all good" JSON
as the daemon's and printed its escape sequences (an OSC 52 clipboard write) raw to root's terminal."""

import json
import socket
import subprocess
from pathlib import Path

import pytest
from helpers import GPUWARDEN, Receiver, free_port, http_get, listening, wait_for

pytestmark = pytest.mark.root

SYSTEM_PYTHON = "/usr/bin/python3"
OSC52 = "\x1b]52;c;cm0gLXJmIH4K\x07"  # "set the clipboard to `rm -rf ~`"
FAKE = {"time": 0, "version": "9.9", "host": "impostor", "pid": 1, "summary": f"{OSC52}ALL GOOD\nno trouble",
        "sources": [], "engines": [], "incidents": [], "gpus": []}
IMPOSTOR = Path(__file__).with_name("impostor_server.py")


def squat(user, port: int, tmp_path: Path):
    """The user's server on the exporter's port, answering every path with the impostor's snapshot."""
    snapshot = tmp_path / "snapshot.json"
    snapshot.write_text(json.dumps(FAKE))
    return user.serve(port, "file", dump=snapshot)


def status(config, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUWARDEN, "--config", str(config), "status", "--timeout", "3", *flags],
                          capture_output=True, text=True, timeout=60)


def test_a_squatter_on_the_exporters_port_is_an_event_and_an_alert_and_never_the_daemons_status(
        lone_attacker, daemon_factory):
    receiver = Receiver().start()
    try:
        d = daemon_factory(f'[alerts]\nurls = ["json://127.0.0.1:{receiver.port}/"]\n')
        squatter = squat(lone_attacker, d.port, d.tmp)
        d.start()
        d.wait_log("gpuwarden running", 30)
        taken = wait_for(lambda: [e for e in d.events() if e["kind"] == "exporter_port_taken"], 20,
                         what="the exporter_port_taken event")
        assert len(taken) == 1 and taken[0]["severity"] == "warning", taken
        assert taken[0]["evidence"]["uid"] == lone_attacker.uid
        assert f"{squatter.pid} {lone_attacker.name} " in taken[0]["message"], taken[0]["message"]
        wait_for(lambda: any("exporter" in r["body"] and lone_attacker.name in r["body"] for r in receiver.received),
                 30, what="the alert")

        # root's `status`: the daemon's own snapshot (through its socket), never the squatter's
        out = status(d.config_path, "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["daemon"]["pid"] == d.proc.pid, out.stdout
        out = status(d.config_path)
        assert f"pid {d.proc.pid}:" in out.stdout and "ALL GOOD" not in out.stdout and "\x1b" not in out.stdout

        squatter.kill()  # the port free again: the daemon takes it
        wait_for(lambda: _serves_metrics(d.port), 20, what="the exporter on its port again")
        assert d.stop() == 0
    finally:
        receiver.stop()


def _serves_metrics(port: int) -> bool:
    try:
        return "gpuwarden_build_info" in http_get(f"http://127.0.0.1:{port}/metrics")
    except OSError:
        return False


def test_status_without_the_daemon_reads_no_squatters_answer(lone_attacker, tmp_path):
    """No daemon (stopped, restarting): the user's server on the port is refused, by its listener's owner."""
    port = free_port()
    config = tmp_path / "gpuwarden.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[exporter]\nport = {port}\n')
    squat(lone_attacker, port, tmp_path)
    out = status(config)
    assert out.returncode == 0, out.stderr
    assert f"is uid {lone_attacker.uid}, not the daemon (root): not read" in out.stderr, out.stderr
    assert "ALL GOOD" not in out.stdout + out.stderr and "\x1b" not in out.stdout + out.stderr
    assert "impostor" not in out.stdout


@pytest.fixture
def root_server(tmp_path):
    """The same server as root's (a process this test starts): what the daemon passes on may carry users' text
    (a log line, a command line)."""
    snapshot, port = tmp_path / "snapshot.json", free_port()
    snapshot.write_text(json.dumps(FAKE))
    proc = listening(subprocess.Popen([SYSTEM_PYTHON, str(IMPOSTOR), str(port), "file", str(snapshot)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), port)
    yield port
    proc.kill()
    proc.wait(10)


def test_status_prints_no_control_character_it_received(root_server, tmp_path):
    config = tmp_path / "gpuwarden.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[exporter]\nport = {root_server}\n')
    out = status(config)
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    assert "\\x1b]52;c;cm0gLXJmIH4K\\x07ALL GOOD\\nno trouble" in out.stdout, out.stdout


def _free_privileged_port() -> int:
    for port in range(1023, 600, -1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    pytest.fail("no free port below 1024")


def test_a_privileged_exporter_port_cannot_be_squatted_and_check_says_when_it_can(lone_attacker, daemon_factory,
                                                                                 tmp_path):
    """The fix docs/security.md picks: a port below net.ipv4.ip_unprivileged_port_start. While gpuwarden is down
    the user cannot take it; `check` says when the configured port is one anyone may take."""
    if int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text()) <= 600:
        pytest.fail("this host lets any user bind every port (ip_unprivileged_port_start): the fix cannot hold")
    import bcrypt

    web = tmp_path / "web.yml"  # a password at stake: Prometheus would send it to the squatter
    web.write_text(f"basic_auth_users:\n  prometheus: {bcrypt.hashpw(b'secret', bcrypt.gensalt(4)).decode()}\n")
    d = daemon_factory()

    def with_password() -> None:
        d.config_path.write_text(d.config_path.read_text().replace(
            "[exporter]\n", f'[exporter]\nweb_config_file = "{web}"\n'))
    with_password()
    out = subprocess.run([*GPUWARDEN, "--config", str(d.config_path), "check"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"exporter.port: {d.port} is unprivileged here" in out.stderr, out.stderr  # a warning at its key

    port = _free_privileged_port()
    d.port = port
    d.write_config()
    with_password()
    out = subprocess.run([*GPUWARDEN, "--config", str(d.config_path), "check"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "is unprivileged here" not in out.stderr, out.stderr
    bind = subprocess.run([SYSTEM_PYTHON, "-c", f"import socket; socket.socket().bind(('127.0.0.1', {port}))"],
                          user=lone_attacker.uid, group=lone_attacker.gid, extra_groups=[], capture_output=True,
                          text=True, timeout=30)
    assert bind.returncode != 0 and "PermissionError" in bind.stderr, bind.stderr
    d.start()
    d.wait_log("gpuwarden running", 30)  # its /metrics asks for the password
    assert not [e for e in d.events() if e["kind"] == "exporter_port_taken"]
    assert d.stop() == 0
