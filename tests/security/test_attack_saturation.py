"""Issue 38, "saturated is not frozen": any client of the engine's port opened 1,100 connections whose request
head never ends; llama-server ran out of descriptors, the canary could not connect, and gpuwarden reported
`engine_unresponsive` and killed the healthy, idle engine (the docs' own llama.cpp example: its log, and a
canary every `canary_interval` while it shows no progress). Now a canary that could not be asked while the
engine idles and the kernel shows it cannot accept (no descriptor left, a full accept queue) is
`engine_saturated`, a warning that names who holds the connections; unresponsive means it accepted and did not
answer.

The engine runs with a soft limit of 1,024 descriptors, the one systemd gives a service (LimitNOFILE=1024:524288)
and most shells a user."""

from __future__ import annotations

import resource
import time

import pytest
from helpers import free_port, wait_for

from peers.engines import LlamaCpp, missing

pytestmark = [pytest.mark.root, pytest.mark.peers]

SYSTEM_PYTHON = "/usr/bin/python3"
CONNECTIONS = 1100
HOLDER = """
import socket, sys, time
port, count = int(sys.argv[1]), int(sys.argv[2])
HEAD = b"GET /health HTTP/1.1\\r\\nHost: x\\r\\n"  # a head that never ends

def opened():
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    return s

held = {}
while True:  # as many as `count` open, each sent a head that never ends; one the server closes is opened again
    while len(held) < count:
        s = opened()
        held[s] = False
    time.sleep(0.2)
    for s in list(held):
        try:
            if not held[s]:
                s.send(HEAD)
                held[s] = True
            elif not s.recv(4096):  # closed by the server (a read timeout)
                raise ConnectionResetError
        except BlockingIOError:
            pass
        except OSError:
            del held[s]
            s.close()
"""


@pytest.fixture
def llama(tmp_path):
    if why := missing("llamacpp"):
        pytest.fail(why)
    server = LlamaCpp(free_port(), tmp_path / "engines", metrics=False).start()
    resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE,
                     (1024, resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE)[1]))
    yield server
    server.stop()


def test_a_thousand_connections_that_never_finish_a_request_saturate_and_never_kill_an_idle_llama_server(
        lone_attacker, llama, daemon_factory):
    d = daemon_factory(  # docs/engines.md's llama.cpp example, with shorter times
        f'[[engine]]\nname = "llama"\nurl = "{llama.url}"\nprofile = "llamacpp"\nsource = "log"\n'
        f'log_file = "{llama.log}"\ncanary_interval = "5s"\ncanary_timeout = "5s"\nscrape_interval = "1s"\n'
        'min_stall = "10s"\nkill_grace = "5s"\n')
    d.start()
    d.wait_serving()
    wait_for(lambda: ok_canaries(d), 30, interval=0.5, what="an idle canary that completes")

    holder = lone_attacker.popen([SYSTEM_PYTHON, "-c", HOLDER, str(llama.port), str(CONNECTIONS)])
    saturated = wait_for(lambda: [e for e in d.events() if e["kind"] == "engine_saturated"], 60, interval=0.5,
                         what="engine_saturated")
    assert len(saturated) == 1 and saturated[0]["severity"] == "warning", saturated
    peers = saturated[0]["evidence"]["peers"]
    assert peers.get(f"uid {lone_attacker.uid} ({lone_attacker.name})", 0) >= 1000, peers
    time.sleep(20)  # several more canaries that cannot connect
    kinds = {e["kind"] for e in d.events()}
    assert not kinds & {"engine_unresponsive", "engine_killed", "kill_refused"}, kinds
    assert llama.proc.poll() is None and not llama.gone()

    holder.kill()  # the crowd gone: the engine completes again
    holder.wait()
    before = ok_canaries(d)
    wait_for(lambda: ok_canaries(d) > before, 60, interval=1, what="a completion again")
    assert d.stop() == 0


def ok_canaries(d) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in d.metrics().splitlines()
               if line.startswith("gpuwarden_engine_canaries_total") and 'outcome="ok"' in line)
