"""Issue 24, findings 1 and 4: the files a user can touch are read as data. The owner of a log-source engine
makes its log_file a FIFO (root's open() blocked in the shared default pool until every thread was stuck: then
no kill, no reload), a device node or a link; or writes a line that never ends (root's memory grew with it)."""

import os
import stat
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from helpers import GPUWARDEN, FakeEngine, wait_for

from gpuwarden.engine.logs import FileLines

pytestmark = pytest.mark.root

INTERVAL, MIN_STALL = 0.5, 2.0
STUCK = 8  # more log engines than the default pool has threads here (min(32, cores + 4))


def log_engine(name: str, log_file: Path, user: str | None = None) -> str:
    return (f'[[engine]]\nname = "{name}"\nurl = "http://127.0.0.1:1"\nsource = "log"\nprofile = "vllm"\n'
            f'log_file = "{log_file}"\nscrape_interval = "{INTERVAL}s"\ncanary = "off"\n'
            + (f'[engine.target]\nuser = "{user}"\n' if user else ""))


def stalling_engine(engine: FakeEngine) -> str:
    return (f'[[engine]]\nname = "root-engine"\nmetrics_url = "{engine.url}"\nscrape_interval = "{INTERVAL}s"\n'
            f'min_stall = "{MIN_STALL}s"\nkill_grace = "1s"\n')


def events_of(d, kind):
    return [e for e in d.events() if e["kind"] == kind]


@pytest.fixture
def root_engine(tmp_path, corpus):
    engine = FakeEngine(tmp_path, corpus / "metrics" / "vllm-01.prom")
    yield engine
    engine.kill()


def test_fifos_as_log_files_are_refused_and_another_engines_stall_is_still_killed(attacker, daemon_factory,
                                                                                   root_engine):
    fifo = attacker.home / "engine.log"
    attacker.run("mkfifo", str(fifo))
    config = "".join(log_engine(f"fifo-{i}", fifo) for i in range(STUCK)) + stalling_engine(root_engine)
    d = daemon_factory(config).start()
    d.wait_serving()
    refused_engines = lambda: {e["engine"] for e in events_of(d, "log_refused")}  # noqa: E731
    wait_for(lambda: len(refused_engines()) == STUCK, 45, interval=0.5,  # a generous bound on a loaded machine
             what="a log_refused per engine")
    [refused] = {e["message"].split(": ", 1)[1] for e in events_of(d, "log_refused")}
    assert refused == f"not reading its log: refused: {fifo} is not a regular file (a FIFO)"
    time.sleep(3 * INTERVAL)  # the old code's opens, one per scrape, would have taken every pool thread by now

    root_engine.set_mode("stall")
    wait_for(lambda: events_of(d, "engine_killed"), 30, interval=0.5, what="the stalled root engine's kill")
    [stall] = events_of(d, "engine_stall")
    assert stall["engine"] == "root-engine"
    assert stall["evidence"]["figures"]["stalled_seconds"] <= MIN_STALL + INTERVAL + 0.25  # threshold + a scrape
    wait_for(lambda: not root_engine.alive(), 10, what="the root engine's tree to be gone")

    done = subprocess.run([*GPUWARDEN, "reload", "--pid", str(d.proc.pid), "--timeout", "20"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "reloaded" in done.stdout, done.stderr
    assert "Traceback" not in d.log()
    assert d.stop() == 0


@pytest.mark.parametrize("kind", ["link", "device node", "another user's file"])
def test_a_link_a_device_node_or_another_users_file_as_log_file_is_refused(attacker, daemon_factory, kind):
    path = attacker.home / "engine.log"
    if kind == "link":
        attacker.run("ln", "-s", "/etc/shadow", str(path))
        why = f"{path} is a symbolic link"
    elif kind == "device node":  # a user cannot mknod; a careless admin's copy (cp -a) or a container can
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.chown(path, attacker.uid, attacker.gid)
        why = f"{path} is not a regular file (a character device)"
    else:
        path.write_text("")
        os.chown(path, 65534, 65534)  # nobody's
        why = f"{path} belongs to uid 65534, not root or the engine's user (uid {attacker.uid})"
    d = daemon_factory(log_engine("attacker-log", path, attacker.name)).start()
    d.wait_serving()
    event = wait_for(lambda: next(iter(events_of(d, "log_refused")), None), 20, interval=0.5,
                     what="the log_refused event")
    assert event["message"] == f"attacker-log: not reading its log: refused: {why}"
    assert event["severity"] == "warning" and event["engine"] == "attacker-log"
    time.sleep(4 * INTERVAL)
    assert len(events_of(d, "log_refused")) == 1  # said once, not at each scrape
    assert d.stop() == 0


def test_a_line_that_never_ends_holds_bounded_memory(tmp_path):
    """A sparse file grown 4 MB at a time (no disk) with no newline: 300 MB of one line. Before, the reader kept
    all of it (2 MB/s of root's memory for a writer at 2 MB/s); now at most MAX_LINE, and the next line is read."""
    log = tmp_path / "engine.log"
    log.write_bytes(b"")
    lines = FileLines(log)
    assert lines.read() == []
    tracemalloc.start()
    try:
        for _ in range(75):
            os.truncate(log, log.stat().st_size + (4 << 20) - 1)  # just under a look's 4 MiB: nothing skipped
            assert lines.read() == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20, f"{peak / 2**20:.0f} MiB"  # a look's read and its split; the old code held 300 MB
    with log.open("ab") as f:
        f.write(b"tail of the endless line\nINFO 01-01 00:00:00 [loggers.py:123] next\n")
    assert lines.read() == ["INFO 01-01 00:00:00 [loggers.py:123] next"]


def test_a_gigabyte_sparse_line_costs_one_look(tmp_path):
    """1 GB of zeros and no newline appear at once: the reader skips to the last 4 MiB and passes over the rest of
    that line; no traceback, the memory of one look."""
    log = tmp_path / "engine.log"
    log.write_bytes(b"")
    lines = FileLines(log)
    lines.read()
    os.truncate(log, 1 << 30)
    tracemalloc.start()
    try:
        assert lines.read() == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20
    with log.open("ab") as f:
        f.write(b"\nnext line\n")
    assert lines.read() == ["next line"]


def test_the_reader_never_opens_what_it_refuses(tmp_path):
    """A FIFO with no writer: an open() for reading would block for ever; the look returns at once, refused."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    script = ("import sys\nfrom pathlib import Path\nfrom gpuwarden.engine.logs import FileLines, LogRefused\n"
              f"try:\n    FileLines(Path({str(fifo)!r})).read()\nexcept LogRefused as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == f"refused: {fifo} is not a regular file (a FIFO)", out.stderr
