"""Freeze one thread of a running process with ptrace while its other threads run on: a real stall of an
engine's inference loop with its HTTP threads still answering.

PTRACE_SEIZE + PTRACE_INTERRUPT put the thread in a ptrace stop (state `t`); PTRACE_DETACH lets it go. ptrace
requests must come from the thread that attached, so one helper thread owns the whole freeze. If the process
is killed meanwhile (SIGKILL ends even a ptrace-stopped thread), the helper reaps it and ends. Needs root or
CAP_SYS_PTRACE.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import threading
import time
import urllib.request
from pathlib import Path

_SEIZE, _INTERRUPT, _DETACH = 0x4206, 0x4207, 17
_WALL = 0x40000000
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long


def _ptrace(request: int, tid: int) -> None:
    if _libc.ptrace(request, tid, None, None) == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"ptrace({request:#x}, {tid}): {os.strerror(err)}")


def thread_state(pid: int, tid: int | None = None) -> str:
    """One letter from /proc (R, S, T, t, Z...), or '' when the thread is gone."""
    try:
        stat = Path(f"/proc/{pid}/task/{tid or pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2]


class Freezer:
    """`with Freezer(pid, tid):` holds that thread in a ptrace stop for the block."""

    def __init__(self, pid: int, tid: int | None = None) -> None:
        self.pid, self.tid = pid, tid or pid
        self._release = threading.Event()
        self._frozen = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._hold, daemon=True)

    def __enter__(self) -> Freezer:
        self._thread.start()
        self._frozen.wait(10)
        if self._error or not self._frozen.is_set():
            raise RuntimeError(f"could not freeze thread {self.tid}") from self._error
        return self

    def __exit__(self, *exc) -> None:
        self.thaw()

    def thaw(self) -> None:
        self._release.set()
        self._thread.join(10)

    def _hold(self) -> None:
        try:
            _ptrace(_SEIZE, self.tid)
            _ptrace(_INTERRUPT, self.tid)
            if not self._wait_stop():
                return
        except BaseException as exc:
            self._error = exc
            return
        self._frozen.set()
        while not self._release.wait(0.1):
            if self._exited():
                return  # killed while frozen: reaped, nothing to detach
        with contextlib.suppress(OSError):
            _ptrace(_DETACH, self.tid)

    def _wait_stop(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            tid, status = os.waitpid(self.tid, os.WNOHANG | _WALL)
            if tid == self.tid:
                return os.WIFSTOPPED(status)
            time.sleep(0.001)
        raise TimeoutError(f"thread {self.tid} did not stop")

    def _exited(self) -> bool:
        try:
            tid, status = os.waitpid(self.tid, os.WNOHANG | _WALL)
        except ChildProcessError:
            return True
        return tid == self.tid and (os.WIFEXITED(status) or os.WIFSIGNALED(status))


def freeze_inside_a_decode(pid: int, metrics_url: str, tries: int = 50) -> Freezer:
    """Freeze llama-server's inference thread (TID == PID) where its /metrics still answers: inside a decode a
    helper thread answers it (the server yields to its queue there); frozen anywhere else /metrics hangs too.
    Freezes again until it lands inside a decode."""
    for _ in range(tries):
        freezer = Freezer(pid).__enter__()
        try:
            urllib.request.urlopen(metrics_url, timeout=1).read()
            return freezer
        except OSError:
            freezer.thaw()
            time.sleep(0.05)
    raise RuntimeError("could not freeze the inference thread inside a decode")
