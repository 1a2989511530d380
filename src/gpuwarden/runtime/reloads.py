"""A reload that its caller can wait for: `gpuwarden reload [--pid PID]` (the unit's ExecReload) signals the daemon
and returns only when the daemon confirms that a reload which read the configuration after the signal finished,
good or bad. systemd 252 has no notify-reload, and `kill -HUP` returns at once, so `systemctl reload && curl`
could see the old configuration.

The confirmation is `state_dir/reload.json` (0600, replaced atomically): the daemon's pid and the CLOCK_MONOTONIC
time at which that reload began to read the configuration. The caller takes the clock before it signals and
accepts only a confirmation from that pid that began later. No earlier reload can pass for this one (it began
before the signal), nor a reload of an earlier daemon (another pid); signals that the kernel merges still get a
reload that read the file after all of them, and the clock is one for every process of the boot.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

FILE = "reload.json"
DB = "gpuwarden.db"


def confirm(state_dir: Path, pid: int, began_ns: int, error: str | None, config: str | None) -> None:
    """Written by the daemon when a reload that began at `began_ns` finished; `error` is why it failed."""
    record = {"pid": pid, "began_ns": began_ns, "finished": time.time(), "ok": error is None, "error": error,
              "config": config}
    tmp = state_dir / f".{FILE}.{pid}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.replace(tmp, state_dir / FILE)


def reason(exc: BaseException) -> str:
    """Why a reload failed, never empty: a TimeoutError, for one, has no message of its own."""
    if isinstance(exc, TimeoutError) and not str(exc):
        return "reading the configuration did not finish in time (a name look-up or a config_file that hangs?)"
    return str(exc) or type(exc).__name__


def read(state_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((state_dir / FILE).read_text())
    except (OSError, ValueError):
        return None  # not written yet, or replaced while read: the next look sees it


def answers(record: dict[str, Any] | None, pid: int, asked_ns: int) -> bool:
    """Is `record` the confirmation of a reload of `pid` asked for at `asked_ns`?"""
    return bool(record) and record.get("pid") == pid and int(record.get("began_ns", -1)) >= asked_ns


def state_dir_of(pid: int) -> Path:
    """The state dir of the gpuwarden daemon `pid`, once `pid` is proven to be one: it runs gpuwarden (`run`)
    with the very interpreter this command runs with, and holds its database open in a folder of its own user
    that no one else may write. Anything else is not signalled (SIGHUP ends most processes), and a confirmation
    is never read from a folder another user could write it in."""
    if why := not_gpuwarden(pid):
        raise LookupError(f"process {pid} is not a gpuwarden daemon ({why})")
    folder = database_dir(pid)
    try:
        st, owner = os.stat(folder), os.stat(f"/proc/{pid}").st_uid
    except OSError as exc:
        raise LookupError(f"process {pid}: {exc.strerror or exc}") from None
    if st.st_uid != owner or st.st_mode & 0o022:
        raise LookupError(f"process {pid}'s state dir {folder} is not its user's alone (owner uid {st.st_uid}, "
                          f"mode {st.st_mode & 0o7777:04o}): its confirmation could be anyone's")
    return folder


def not_gpuwarden(pid: int) -> str | None:
    """Why `pid` is not `gpuwarden run` started from this installation (None: it is)."""
    try:
        theirs, ours = os.stat(f"/proc/{pid}/exe"), os.stat("/proc/self/exe")
        argv = [os.fsdecode(a) for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]
    except FileNotFoundError:
        raise LookupError(f"no process {pid}") from None
    except PermissionError:
        raise LookupError(f"cannot see what process {pid} runs (run as its user or root)") from None
    except OSError as exc:
        return exc.strerror or str(exc)
    if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
        return f"it runs {os.readlink(f'/proc/{pid}/exe')}, not {os.readlink('/proc/self/exe')}"
    module = argv[1:3] == ["-m", "gpuwarden"]
    script = len(argv) > 1 and os.path.basename(argv[1]) == "gpuwarden"
    if not (module or script) or "run" not in argv[2:]:
        return f"its command line is not `gpuwarden run`: {' '.join(argv)[:200]!r}"
    return None


def database_dir(pid: int) -> Path:
    """Where the database that `pid` holds open lies."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        raise LookupError(f"no process {pid}") from None
    except PermissionError:
        raise LookupError(f"cannot see the open files of process {pid} (run as its user or root)") from None
    for fd in fds:
        try:
            target = Path(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:  # closed meanwhile
            continue
        if target.name == DB:
            return target.parent
    raise LookupError(f"process {pid} is not a gpuwarden daemon (it holds no {DB} open)")


def request(pid: int, timeout: float, poll: float = 0.05) -> dict[str, Any]:
    """Signal `pid` and wait up to `timeout` seconds for its confirmation; TimeoutError, LookupError."""
    state_dir = state_dir_of(pid)
    asked = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answers(record := read(state_dir), pid, asked):
            return record
        if not Path(f"/proc/{pid}").exists():
            raise LookupError(f"process {pid} ended before it confirmed the reload")
        time.sleep(poll)
    raise TimeoutError(f"process {pid} did not confirm the reload within {timeout:.0f} s (see its log)")


def find_daemon(state_dir: Path, proc: Path = Path("/proc")) -> int:
    """The pid of the one gpuwarden daemon whose store lies in `state_dir` (the configuration's); LookupError
    when there is none, or more than one (then --pid says which)."""
    want = state_dir.resolve()
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # ended meanwhile, or not ours to read
            continue
        if b"run" not in argv or not any(b"gpuwarden" in a for a in argv):
            continue
        try:
            if state_dir_of(int(entry.name)).resolve() == want:
                found.append(int(entry.name))
        except LookupError:
            continue
    if len(found) != 1:
        raise LookupError(f"{'no' if not found else len(found)} gpuwarden daemon{'s' if found else ''} running with "
                          f"the state_dir {state_dir}" + ("; say which with --pid" if found else ""))
    return found[0]
