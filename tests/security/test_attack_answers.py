"""A local user answers where root's gpuwarden and its tools ask: on the exporter's port while the daemon is not
there, as a canary that answers too much, as a server that answers one byte at a time. The user is real
(gwattacker) and so are its servers (impostor_server.py, run from its home)."""

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest
from helpers import GPUWARDEN, free_port, wait_for

from gpuwarden.runtime import sockets

pytestmark = pytest.mark.root

SYSTEM_PYTHON = "/usr/bin/python3"


def npd_daemon(config) -> tuple[int, str]:
    result = subprocess.run([*GPUWARDEN, "--config", str(config), "npd-check", "--condition", "daemon",
                             "--timeout=3"], capture_output=True, text=True, timeout=15)
    return result.returncode, result.stdout.strip()


def test_a_user_holding_the_exporters_port_neither_stops_the_daemon_nor_passes_for_it(attacker, daemon_factory):
    """The exporter's port is unprivileged: a user can take it while gpuwarden is down (a restart, a boot) and
    serve a healthy-looking gpuwarden there. gpuwarden must run all the same (its kernel watch and killer matter
    more than its metrics) and take the port when it is free; npd-check must not vouch for the impostor."""
    d = daemon_factory()
    impostor = attacker.serve(d.port, "exporter")
    d.start()
    d.wait_log("gpuwarden running", timeout=15)
    assert d.proc.poll() is None, d.log()
    assert "cannot serve metrics" in d.log()
    code, text = npd_daemon(d.config_path)
    assert code == 1 and f"uid {attacker.uid}" in text, text
    impostor.kill()
    impostor.wait()
    d.wait_serving()  # the daemon takes its port back once it is free
    assert "gpuwarden_build_info" in d.metrics()
    assert npd_daemon(d.config_path) == (0, "gpuwarden runs, every component up")


def test_a_canary_answer_of_any_size_does_not_grow_the_daemon(attacker, daemon_factory, corpus):
    """The canary's answer is one token; an engine that answers 400 MB instead must not make root's daemon hold
    them (the scrape's body is capped; the canary's must be too)."""
    port = free_port()
    attacker.serve(port, "engine", dump=corpus / "metrics" / "vllm-01.prom")
    d = daemon_factory(f'[[engine]]\nname = "big"\nurl = "http://127.0.0.1:{port}"\ncanary = "sglang"\n'
                       f'canary_interval = "1s"\ncanary_timeout = "20s"\nscrape_interval = "0.5s"\n'
                       f'on_stall = "alert"\n[engine.target]\nuser = "{attacker.name}"\n')
    d.start()
    d.wait_serving()
    wait_for(lambda: 'gpuwarden_engine_canaries_total{engine="big"' in d.metrics(), 40, 0.5, what="a canary")
    peak = next(int(line.split()[1]) for line in Path(f"/proc/{d.proc.pid}/status").read_text().splitlines()
                if line.startswith("VmHWM:"))
    assert peak < 200 << 10, f"the daemon's peak memory is {peak} kB after the canary"  # kB; it idles near 60 MB
    assert 'outcome="error"' in next(line for line in d.metrics().splitlines() if "canaries_total" in line
                                     and not line.startswith("#"))


def test_a_dripping_server_holds_up_neither_discovery_nor_probe(attacker, daemon_factory, corpus):
    """Discovery asks every server that looks like an engine whether its /metrics answers, one after another
    (lowest port first): one answering a byte at a time must not keep it from the engines after it, and `probe`
    must end within its bounds."""
    drip, engine = sorted([free_port(), free_port()])
    attacker.serve(drip, "drip", "vllm", "serve")
    attacker.serve(engine, "engine", "vllm", "serve", dump=corpus / "metrics" / "vllm-01.prom")
    d = daemon_factory("[engines]\ndiscover = true\n")  # its defaults
    d.start()
    d.wait_serving()
    d.wait_log(f"discovered vllm serving on port {engine}", timeout=30)
    started = time.monotonic()
    result = subprocess.run([*GPUWARDEN, "probe", f"http://127.0.0.1:{drip}/metrics", "--timeout", "2"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("api", ["ollama", "openai"])
def test_a_canary_answer_of_the_wrong_shape_is_an_error_not_a_crash(attacker, daemon_factory, corpus, api):
    """Valid JSON of no shape the API has (`[]` where an object is due) is the canary's error; it used to escape
    as an AttributeError and take down the watch of every engine."""
    port = free_port()
    attacker.serve(port, "list", dump=corpus / "metrics" / "vllm-01.prom")
    d = daemon_factory(f'[[engine]]\nname = "odd"\nurl = "http://127.0.0.1:{port}"\ncanary = "{api}"\n'
                       f'canary_interval = "1s"\nscrape_interval = "0.5s"\non_stall = "alert"\n'
                       f'[engine.target]\nuser = "{attacker.name}"\n')
    d.start()
    d.wait_serving()
    wait_for(lambda: 'gpuwarden_engine_canaries_total{engine="odd",outcome="error"}' in d.metrics(), 20, 0.5,
             what="a canary's error")
    time.sleep(1)
    assert "component engines failed" not in d.log()
    assert 'gpuwarden_component_restarts_total{component="engines"} 0.0' in d.metrics()


def test_a_log_line_built_against_the_rules_does_not_block_the_daemon(attacker, daemon_factory):
    """A log line carries text that others choose (a prompt vLLM logs, the request path in Ollama's GIN line):
    SGLang's prefix repeated with no end for the rule's gap made its search quadratic on the event loop (this
    line held it for about a minute). Rules now ignore lines longer than any they know, and their gaps are
    bounded."""
    log = attacker.write(attacker.home / "engine.log", "")
    d = daemon_factory(f'[[engine]]\nname = "chatty"\nurl = "http://127.0.0.1:{free_port()}"\nsource = "log"\n'
                       f'log_file = "{log}"\nscrape_interval = "0.5s"\non_stall = "alert"\n'
                       f'[engine.target]\nuser = "{attacker.name}"\n')
    d.start()
    d.wait_serving()
    time.sleep(1.5)  # the first look has positioned the reader at the end of the log
    attacker.run(SYSTEM_PYTHON, "-c", "import sys; open(sys.argv[1], 'a').write('prompt: ' + "
                 "'Decode batch, #running-req: 1, ' * 20000 + '\\n')", str(log))

    def lag() -> float:
        try:
            return float(next(line.split()[1] for line in d.metrics().splitlines()
                              if line.startswith("gpuwarden_loop_lag_seconds ")))
        except OSError:  # no answer at all: a regex holds the GIL, the exporter's thread waits too
            return float("inf")
    lags = []
    for _ in range(30):
        time.sleep(0.5)
        lags.append(lag())
    assert max(lags) < 10, f"the daemon was blocked (loop lag {max(lags):.1f} s)"


HOLD = """
import resource, socket, sys, threading, time
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
held = []
def hold():
    for _ in range(int(sys.argv[2])):
        try:
            held.append(socket.create_connection(("127.0.0.1", int(sys.argv[1])), 30))
        except OSError:
            pass
for t in [threading.Thread(target=hold) for _ in range(16)]:
    t.start()
time.sleep(600)
"""


def test_connections_held_to_the_exporter_cost_the_daemon_no_more_than_a_few_descriptors(attacker, daemon_factory):
    """Anyone can connect to the exporter. Each connection held open, unanswered, used to keep a thread and a
    descriptor of the daemon for ever: enough of them (systemd's soft LimitNOFILE is 1024) and it can open
    nothing else, /proc included, so it can neither judge nor kill."""
    d = daemon_factory()
    d.start()
    d.wait_serving()
    before = len(os.listdir(f"/proc/{d.proc.pid}/fd"))
    holder = attacker.popen([SYSTEM_PYTHON, "-c", HOLD, str(d.port), "40"])  # 16 × 40 connections
    time.sleep(15)
    held = len(os.listdir(f"/proc/{d.proc.pid}/fd"))
    assert held < before + 40, f"{held - before} more descriptors with connections held"
    # While they are held Prometheus may be refused (GpuwardenDown says so); once they go, it is served again.
    holder.kill()
    holder.wait()
    assert "gpuwarden_build_info" in wait_for(lambda: _metrics(d), 15, 0.5, what="the exporter again")
    assert d.proc.poll() is None


ASK = """
import socket, sys, threading, time
def ask():
    while True:  # each place held by asking for a page well within the deadline; taken again when dropped
        try:
            with socket.create_connection(("127.0.0.1", int(sys.argv[1])), 5) as sock:
                while True:
                    sock.sendall(b"GET /nowhere HTTP/1.1\\r\\n\\r\\n")
                    if not sock.recv(65536):
                        break
                    time.sleep(1)
        except OSError:
            pass
        time.sleep(0.5)
for t in [threading.Thread(target=ask) for _ in range(16)]:
    t.start()
time.sleep(600)
"""


def test_a_user_asking_on_every_connection_the_exporter_allows_does_not_keep_prometheus_out(attacker, daemon_factory):
    """All 16 places, each kept by a request a second (a client that does not need the deadline to be dropped, as
    Prometheus's own kept connection): past 16, a new connection was closed unanswered, so the user kept every
    scrape out for as long as it liked. A new one now takes the place of the one opened longest ago."""
    d = daemon_factory()
    d.start()
    d.wait_serving()
    holder = attacker.popen([SYSTEM_PYTHON, "-c", ASK, str(d.port)])
    try:
        # counted as the connections the daemon holds, not as its descriptors against a count taken before: fc15
        # never saw 16 more, a descriptor open at that count (the daemon's own, for a moment) being gone since
        wait_for(lambda: _served(d.proc.pid, d.port) >= 16, 15, 0.2, what="the user to hold every place")
        time.sleep(3)  # every place asked for again, more than once
        for _ in range(3):
            assert "gpuwarden_build_info" in d.metrics()
            time.sleep(1)
    finally:
        holder.kill()
        holder.wait()


def _served(pid: int, port: int) -> int:
    """How many established TCP connections to local `port` process `pid` holds a descriptor of."""
    inodes = {f"socket:[{fields[9]}]" for fields in sockets._rows(Path("/proc/net"), port)  # the kernel's tables
              if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01"}  # local port, established
    held = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            held += os.readlink(f"/proc/{pid}/fd/{fd}") in inodes
    return held


def _metrics(d) -> str | None:
    try:
        return d.metrics()
    except OSError:
        return None
