"""Issue 36 and issue 38's first finding, as real unprivileged users (useradd, names of their own) against the real
daemon process:

- a user holding about a million descriptors made every look at an engine read them all
  (psutil.net_connections): 10.5 s a look here, past its 10 s deadline; a stalled engine never looked at before
  was never killed. Now a look reads the engine user's descriptors only: the stall is killed on time.
- a user's server on the engine's port, bound the moment gpuwarden killed the engine, was taken for the engine
  coming back: scraped with metrics_url's password and ?token=, canaried, `engine_back`. Now it is never read,
  never asked, never killed: one engine_port_taken naming it, and the engine counts as down."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from helpers import FakeEngine, wait_for

from hoarder import SYSTEM_PYTHON, hoarder

pytestmark = pytest.mark.root

INTERVAL, MIN_STALL, GRACE = 0.5, 3.0, 1.0

# The squatter: answers every request as a healthy vLLM would (its counters move, its completions return) and
# writes down each request's head, where root can read what it was sent.
SQUAT = r"""
import socket, sys, time
port, log = int(sys.argv[1]), sys.argv[2]
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
for _ in range(200):
    try:
        server.bind(("127.0.0.1", port))
        break
    except OSError:
        time.sleep(0.05)
server.listen(16)
started = time.monotonic()
while True:
    conn, _ = server.accept()
    conn.settimeout(2)
    try:
        head = conn.recv(65536)
    except OSError:
        head = b""
    with open(log, "ab") as f:
        f.write(head + b"\n----\n")
    tokens = 1000 + 40 * (time.monotonic() - started)
    if b"/metrics" in head:
        body = ("vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
                f"vllm:generation_tokens_total {tokens}\nvllm:prompt_tokens_total {tokens}\n").encode()
        kind = b"text/plain"
    else:
        body = b'{"object": "text_completion", "choices": [{"text": "x", "index": 0}], "data": [{"id": "m"}]}'
        kind = b"application/json"
    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: " + kind + b"\r\nContent-Length: " +
                 str(len(body)).encode() + b"\r\n\r\n" + body)
    conn.close()
"""


@pytest.fixture
def user():
    """A real unprivileged user of this test's own (the attack suite's shared name is another checkout's too)."""
    name = f"gwsq{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name],
                   check=True, capture_output=True)
    entry, procs = pwd.getpwnam(name), []
    yield entry, procs
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, 9)
        proc.wait(10)
    subprocess.run(["userdel", "--force", name], capture_output=True, check=False)


def events(d, *kinds):
    return [e for e in d.events() if e["kind"] in kinds]


def config(url: str) -> str:
    return (f'[[engine]]\nname = "victim"\nmetrics_url = "{url}"\nscrape_interval = "{INTERVAL}s"\n'
            f'min_stall = "{MIN_STALL}s"\nkill_grace = "{GRACE}s"\non_stall = "kill"\n')


def test_a_user_holding_a_million_descriptors_delays_no_kill(daemon_factory, tmp_path, corpus):
    """Issue 36: the stall of an engine never looked at before, beside a user holding ~1 M descriptors, killed
    within its threshold + one scrape + 2 s; no look misses its deadline."""
    engine = FakeEngine(tmp_path, corpus / "metrics" / "vllm-01.prom", "vllm", "progress", "--spin")
    try:
        with hoarder() as hoard:
            assert hoard.held >= 950_000, hoard.held
            d = daemon_factory(config(engine.url)).start()
            d.wait_serving()
            time.sleep(4 * INTERVAL)
            engine.set_mode("stall")
            stalled_at = time.monotonic()
            wait_for(lambda: events(d, "engine_killed", "kill_not_done", "kill_refused"), 60, interval=0.1,
                     what="the stall's kill")
            wait_for(lambda: not engine.alive(), 10, interval=0.1, what="the engine's tree gone")
            took = time.monotonic() - stalled_at
            [stall] = events(d, "engine_stall")
            threshold = stall["evidence"]["figures"]["threshold_seconds"]
            print(f"stall onset to tree gone {took:.1f} s beside {hoard.held} descriptors of {hoard.name} "
                  f"(threshold {threshold} s + scrape {INTERVAL} s + 2 s)")
            assert [e["kind"] for e in events(d, "engine_killed", "kill_not_done", "kill_refused")] == \
                ["engine_killed"]
            assert "took longer than" not in d.log()
            assert took <= threshold + INTERVAL + 2 + GRACE
            assert d.stop() == 0
    finally:
        engine.kill()


def test_a_squatter_on_the_freed_port_is_never_back_never_asked_never_killed(daemon_factory, tmp_path, corpus, user):
    """Issue 38, finding 1: the engine is killed for a stall; a user's server takes its port at once and answers
    as a healthy engine. It gets no request (no password, no token), is never `back`, never killed."""
    entry, procs = user
    engine = FakeEngine(tmp_path, corpus / "metrics" / "vllm-01.prom", "vllm", "progress")
    home = Path(tempfile.mkdtemp(prefix="gwsquat-"))  # the user's: pytest's own folders are root's alone
    home.chmod(0o755)
    script, log = home / "squat.py", home / f"squat-{engine.port}.log"
    script.write_text(SQUAT)
    script.chmod(0o644)
    log.touch()
    os.chown(log, entry.pw_uid, entry.pw_gid)
    url = f"http://gw:s3cret-pw@127.0.0.1:{engine.port}/metrics?token=s3cret-tok"
    try:
        d = daemon_factory(config(url)).start()
        d.wait_serving()
        time.sleep(4 * INTERVAL)
        engine.set_mode("stall")
        wait_for(lambda: events(d, "engine_killed"), 30, interval=0.1, what="the engine killed")
        wait_for(lambda: not engine.alive(), 10, interval=0.05, what="the engine's tree gone")
        squatter = subprocess.Popen([SYSTEM_PYTHON, str(script), str(engine.port), str(log), "--api-key",
                                     "sq-secret-key"], user=entry.pw_uid,
                                    group=entry.pw_gid, extra_groups=[], cwd="/", env={"PATH": "/usr/bin:/bin"},
                                    start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(squatter)
        taken = wait_for(lambda: next(iter(events(d, "engine_port_taken")), None), 20, interval=0.2,
                         what="engine_port_taken")
        time.sleep(10 * INTERVAL)  # scrapes, canaries and looks go on meanwhile
        assert f"uid {entry.pw_uid} ({entry.pw_name}): {squatter.pid} {entry.pw_name} " in taken["message"], taken
        assert taken["severity"] == "critical" and str(script) in taken["evidence"]["holder"]
        assert "--api-key ***" in taken["message"] and "sq-secret-key" not in json.dumps(taken)
        assert log.read_bytes() == b"", log.read_bytes()[:300]  # not one request: no password, no token
        assert squatter.poll() is None
        assert [e["kind"] for e in events(d, "engine_killed", "kill_refused", "engine_back", "kill_not_done",
                                          "engine_port_taken")] == ["engine_killed", "engine_port_taken"]
        assert 'gpuwarden_engine_up{engine="victim"} 0' in d.metrics()
        assert d.stop() == 0
    finally:
        engine.kill()
        shutil.rmtree(home, ignore_errors=True)
