"""Faults made of real parts, shared by unit and integration tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_HOLD = ("import sqlite3, sys\n"
         "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
         "db.execute('BEGIN EXCLUSIVE')\n"
         "print('held', flush=True)\n"
         "sys.stdin.read()\n")


class LockHolder:
    """A real second process holding a SQLite database's write lock (`BEGIN EXCLUSIVE`) until released."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline() == "held\n"

    def release(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(10)
