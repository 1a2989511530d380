"""What a look at an engine's processes walks (engine/processes.py `Tracker.refresh`), on real processes: a
scrape's look walks down the engine's own tree and never reads the rest of its user's processes; a kill's look
also reads them, for a member of the root's process group outside the tree; a process of the engine's user
that is neither is never taken.

The engine is a real server process (`ENGINE`) that forks a sleeping worker for each connection it accepts and
answers with the worker's pid: a worker born after the tracker's first look."""

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import uuid

import pytest
from helpers import free_port, wait_for

from gpuwarden.config.settings import EngineConfig, parse
from gpuwarden.core.model import NullSink
from gpuwarden.engine import processes
from gpuwarden.engine.looks import Looker
from gpuwarden.engine.processes import Tracker
from gpuwarden.engine.targets import KillTarget
from gpuwarden.engine.watch import EngineWatch

ENGINE = """
import os, socket, subprocess, sys, time
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
while True:
    conn, _ = server.accept()
    if conn.recv(1) == b"o":  # an orphan: a child that forks a grandchild, tells its pid and exits
        r, w = os.pipe()
        if os.fork() == 0:
            grandchild = os.fork()
            if grandchild == 0:
                time.sleep(600)
                os._exit(0)
            os.write(w, str(grandchild).encode())
            os._exit(0)
        worker = int(os.read(r, 32))
        os.wait()
    else:
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid
    conn.sendall(str(worker).encode())
    conn.close()
"""
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


@contextlib.contextmanager
def engine(**popen):
    """The engine's root on a port of its own, and a way to make it fork a worker (its pid)."""
    port = free_port()
    root = subprocess.Popen([sys.executable, "-c", ENGINE, str(port), f"gpuwarden-test-{uuid.uuid4().hex}"], **popen)
    workers: list[int] = []

    def fork(what: bytes = b"w") -> int:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(what)
            workers.append(int(conn.recv(32)))
        return workers[-1]

    def serving() -> bool:
        assert root.poll() is None, "the engine exited"
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.sendall(b"w")
            workers.append(int(conn.recv(32)))  # it forks a first worker: the engine's too
            return True
        return False
    try:
        wait_for(serving, 15, interval=0.05, what="the engine to listen")
        yield root, port, fork
    finally:
        root.kill()
        root.wait()
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def user_reads(monkeypatch):
    """How often the look read every process of the engine's user (`pids_of`, the real one, counted)."""
    calls, real = [], processes.pids_of
    monkeypatch.setattr(processes, "pids_of", lambda *a, **k: calls.append(a) or real(*a, **k))
    return calls


def config(port: int) -> EngineConfig:
    return EngineConfig(name="e", metrics_url=f"http://127.0.0.1:{port}/metrics")


def pids(seen) -> set[int]:
    return {p.pid for p in seen.procs}


def test_a_worker_born_after_the_first_look_is_found_without_reading_the_users_processes(user_reads):
    with engine(start_new_session=True) as (root, port, fork):
        looker, tracker = Looker(nvml=False), Tracker()
        first = looker._look(config(port), tracker)
        assert root.pid in pids(first)
        worker = fork()
        user_reads.clear()
        seen = looker._look(config(port), tracker)
        assert worker in pids(seen) and root.pid in pids(seen)
        assert user_reads == []  # the engine's tree alone was read


def test_a_process_of_the_engines_user_outside_its_tree_is_never_taken():
    """Another process of the same user (in a session of its own) is taken by no look, narrow or a kill's."""
    with engine(start_new_session=True) as (root, port, fork), \
            subprocess.Popen(SLEEPER, start_new_session=True) as stranger:
        try:
            looker, tracker = Looker(nvml=False), Tracker()
            looker._look(config(port), tracker)
            worker = fork()
            for wide in (False, True):
                seen = pids(looker._look(config(port), tracker, wide))
                assert root.pid in seen and worker in seen and stranger.pid not in seen
        finally:
            stranger.kill()


def test_a_kills_look_takes_a_process_that_joined_the_roots_group_outside_its_tree(user_reads, monkeypatch):
    """A pipeline's other command (a process of the root's group that the root did not fork), started after the
    first look: a scrape's look reads the user's processes only WIDE_AFTER after the last time, so it sees it no
    later than that; the kill's look (the watch's `take`) at once, as every look did before."""
    with engine(process_group=0) as (root, port, _):  # a group of its own, in this session
        settings = parse(f'[[engine]]\nname = "e"\nmetrics_url = "http://127.0.0.1:{port}/metrics"\n')
        watch = EngineWatch(settings.engines, settings.engine, NullSink(), nvml=False)
        state = watch.engines["e"]
        assert asyncio.run(watch.inspect(state))
        with subprocess.Popen(SLEEPER, process_group=root.pid) as sibling:
            try:
                user_reads.clear()
                assert asyncio.run(watch.inspect(state))
                assert user_reads == []  # a scrape's look: the tree alone
                target = asyncio.run(watch.take("e", restart=False, dry_run=True))
                assert isinstance(target, KillTarget)
                assert {root.pid, sibling.pid} <= {p.pid for p in target.procs}
                state.tracker = Tracker()  # a tracker that never saw it: the first look reads them all
                asyncio.run(watch.inspect(state))
                with subprocess.Popen(SLEEPER, process_group=root.pid) as late:
                    try:
                        monkeypatch.setattr(processes, "WIDE_AFTER", 0.0)  # the time to read them again has come
                        assert asyncio.run(watch.inspect(state))
                        assert late.pid in {p.pid for p in state.procs}
                    finally:
                        late.kill()
            finally:
                sibling.kill()



def test_engines_of_one_user_due_together_share_one_read_of_its_processes(monkeypatch):
    """Each engine's scrape reads every process of its user WIDE_AFTER after its last such read; engines started
    together come due together, and a read made within SHARED_FOR serves the others (32 docker engines each read
    every root process within the same seconds). The read's own time is theirs: none of them holds a read older
    than WIDE_AFTER. A kill's look, or one after its tree changed, reads anew."""
    reads, real = [], processes._family
    monkeypatch.setattr(processes, "_family", lambda uid: reads.append(uid) or real(uid))
    with engine(start_new_session=True) as (first, port1, _), engine(start_new_session=True) as (second, port2, _):
        looker, one, two = Looker(nvml=False), Tracker(), Tracker()
        looker._look(config(port1), one)
        looker._look(config(port2), two)
        assert len(reads) == 2  # each tracker's first look: roots new to it, read at once
        processes._families.clear()  # the last read is older than SHARED_FOR
        one.wide_at -= processes.WIDE_AFTER  # and both are due by the clock
        two.wide_at -= processes.WIDE_AFTER
        assert first.pid in pids(looker._look(config(port1), one))
        assert second.pid in pids(looker._look(config(port2), two))
        assert len(reads) == 3 and one.wide_at == two.wide_at  # one read served both
        looker._look(config(port2), two, wide=True)  # a kill's look
        assert len(reads) == 4
        monkeypatch.setattr(processes, "WIDE_AFTER", 0.0)  # due at every look: no read is young enough to share
        looker._look(config(port1), one)
        looker._look(config(port2), two)
        assert len(reads) == 6

def test_an_orphan_born_between_two_looks_is_in_the_kills_look():
    """A child the engine forks forks a grandchild and exits between two looks: the grandchild, never seen as
    part of the tree, is re-parented outside it; the kill's look takes it back by the root's process group."""
    with engine(start_new_session=True) as (root, port, fork):
        settings = parse(f'[[engine]]\nname = "e"\nmetrics_url = "http://127.0.0.1:{port}/metrics"\n')
        watch = EngineWatch(settings.engines, settings.engine, NullSink(), nvml=False)
        assert asyncio.run(watch.inspect(watch.engines["e"]))
        orphan = fork(b"o")
        target = asyncio.run(watch.take("e", restart=False, dry_run=True))
        assert isinstance(target, KillTarget)
        assert {root.pid, orphan} <= {p.pid for p in target.procs}


def test_without_the_kernels_children_lists_every_look_reads_the_users_processes(user_reads, monkeypatch):
    """A kernel built without CONFIG_PROC_CHILDREN lists no thread's children: each look is then a wide one, and
    finds the worker by the parent it names. Such a kernel cannot be had here (this one lists them): its answer,
    no list, is mocked."""
    monkeypatch.setattr(processes, "_CHILDREN", False)
    monkeypatch.setattr(processes, "children_of", lambda pid, tasks=None: [])  # what such a kernel lets a walk see
    with engine(start_new_session=True) as (root, port, fork):
        looker, tracker = Looker(nvml=False), Tracker()
        looker._look(config(port), tracker)
        worker = fork()
        user_reads.clear()
        assert {root.pid, worker} <= pids(looker._look(config(port), tracker))
        assert user_reads != []


def test_a_look_reads_each_of_the_engines_processes_once(monkeypatch):
    """Its descriptors (who holds the engine's socket, whether its tree does, which GPUs it has open), its threads
    (their children, their waits) and its status (whose it is) are read once a look: a look read the root's
    descriptors and status three times each, and its threads twice."""
    with engine(start_new_session=True) as (root, port, fork):
        looker, tracker = Looker(nvml=False), Tracker()
        looker._look(config(port), tracker)
        worker = fork()
        looker._look(config(port), tracker)  # the worker known: the next look asks it first, with the root
        listed, read = [], []
        scandir, listdir, read_small = os.scandir, os.listdir, processes.read_small
        monkeypatch.setattr(os, "scandir", lambda path, *a: listed.append(str(path)) or scandir(path, *a))
        monkeypatch.setattr(os, "listdir", lambda path, *a: listed.append(str(path)) or listdir(path, *a))
        monkeypatch.setattr(processes, "read_small", lambda path, *a: read.append(str(path)) or read_small(path, *a))
        seen = looker._look(config(port), tracker)
        assert {root.pid, worker} <= pids(seen)
        for pid in (root.pid, worker):
            assert listed.count(f"/proc/{pid}/fd") == listed.count(f"/proc/{pid}/task") == 1, listed
            assert read.count(f"/proc/{pid}/status") == 1, read
            assert read.count(f"/proc/{pid}/stat") == 1, read
