"""A real unprivileged user (useradd, a name of its own per use) that holds about a million file descriptors: 50
sleeping processes, each with ~20,000 dup()s of /dev/null, within the default limits (the per-process hard limit
here is 20,000: each stays under it). Issue 36: psutil.net_connections() read every one of them on every look at
an engine (11-15 s a look). Used by tests/security/test_attack_engine_port.py and bench/look_bench.py; ended by
pid, the user removed after."""

from __future__ import annotations

import contextlib
import os
import pwd
import resource
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator

SYSTEM_PYTHON = "/usr/bin/python3"  # the test's own interpreter may live where the user cannot read
_HOLD = """
import os, resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, want + 16), hard))
fd = os.open("/dev/null", os.O_RDONLY)
held = []
try:
    while len(held) < want:
        held.append(os.dup(fd))
except OSError:
    pass
print(len(held), flush=True)
os.close(1)
while True:
    os.pause() if hasattr(os, "pause") else __import__("time").sleep(3600)
"""


@contextlib.contextmanager
def hoarder(processes: int = 50, each: int | None = None) -> Iterator[Hoard]:
    """A new user holding `processes` x `each` descriptors (each: as many as the hard limit lets, up to 20,000)."""
    name = f"gwfd{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name],
                   check=True, capture_output=True)
    hoard = Hoard(pwd.getpwnam(name))
    try:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        per = each or min(20_000, hard - 16)
        hoard.start(processes, per)
        yield hoard
    finally:
        hoard.end()
        subprocess.run(["userdel", "--force", name], capture_output=True, check=False)


class Hoard:
    def __init__(self, entry: pwd.struct_passwd) -> None:
        self.uid, self.gid, self.name = entry.pw_uid, entry.pw_gid, entry.pw_name
        self.procs: list[subprocess.Popen] = []
        self.held = 0

    def start(self, processes: int, each: int) -> None:
        for _ in range(processes):
            self.procs.append(subprocess.Popen([SYSTEM_PYTHON, "-c", _HOLD, str(each)], user=self.uid, group=self.gid,
                                               extra_groups=[], cwd="/", env={"PATH": "/usr/bin:/bin"},
                                               start_new_session=True, stdout=subprocess.PIPE,
                                               stderr=subprocess.DEVNULL))
        for proc in self.procs:  # each says how many it holds once it holds them
            self.held += int(proc.stdout.readline() or 0)
            proc.stdout.close()

    def end(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
