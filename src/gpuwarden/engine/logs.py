"""Progress from an engine's own log, for the same stall detector as /metrics.

`LogReader` is pure: lines in, an `EngineSample` out (progress counts the lines that prove tokens were
processed; running is what the last lines said). The sources are thin edges that hand it the lines written
since the last look: a file (followed across rotation and truncation), the journal of a systemd unit
(`_SYSTEMD_UNIT`), or a Docker container's log (engine/dockerlog.py). Each look is bounded in bytes and runs
off the event loop with a deadline.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwarden import enginekinds
from gpuwarden.engine.metrics import EngineSample
from gpuwarden.engine.scraper import ScrapeError
from gpuwarden.enginekinds.base import EngineKind
from gpuwarden.runtime.offloop import Busy, OffLoop

_MAX_READ = 4 << 20  # bytes read per look: a log flood is skipped past, not slurped
_DEADLINE = 5.0
_READS = OffLoop("log read", limit=64)  # one per engine: a read stuck in a filesystem holds one thread, no more
MAX_LINE = 64 << 10  # a longer line is passed over (no rule reads past MAX_RULE_LINE anyway)
# The lines the rules know are under 400 characters (tests/corpus/logs); a longer one carries someone's text and
# is passed over, which also bounds the rules' work per line.
MAX_RULE_LINE = 2048
# A terminal's colours (a Docker TTY, vLLM's coloured level) sit inside the prefix the rules are anchored to
_COLOUR = re.compile(r"\x1b\[[0-9;]{0,16}m")


class LogReader:
    def __init__(self, profile: str = "auto") -> None:
        self.profile: EngineKind | None = None if profile == "auto" else enginekinds.named(profile)
        self.progress = 0
        self.running: dict[str, int] = {}  # per engine index or slot
        self.lines = 0  # lines a rule matched
        self._timing = (0.0, 0)  # finished requests' seconds, count
        self._moves: dict[tuple[str, str], str] = {}  # (key, group) -> its value in the last line

    def feed(self, line: str) -> None:
        if len(line) > MAX_RULE_LINE:
            return
        line = _COLOUR.sub("", line) if "\x1b" in line else line
        for kind in (self.profile,) if self.profile else [k for k in enginekinds.all_kinds() if k.log]:
            for rule in kind.log.rules:
                match = rule.pattern.match(line)  # anchored: see enginekinds/base.py
                if match:
                    self.profile = kind  # auto: the first engine whose line is seen
                    self.lines += 1
                    self._apply(rule, match.groupdict())
                    return

    def _apply(self, rule, groups: dict[str, str | None]) -> None:
        key = groups.get("key") or ""
        if rule.running == "set":
            self.running[key] = int(groups["running"]) + int(groups.get("new") or 0)
        elif rule.running == "busy":
            self.running[key] = 1
        elif rule.running == "idle":
            self.running.pop(key, None)
        if rule.all_idle:
            self.running.clear()
        moved = False
        for group in rule.moves:
            if (value := groups.get(group)) is not None:
                moved |= self._moves.get((key, group), value) != value
                self._moves[key, group] = value
        if moved or rule.progress or (rule.tokens and sum(float(groups[g]) for g in rule.tokens) > 0):
            self.progress += 1
        if rule.request_ms:
            seconds, count = self._timing
            self._timing = (seconds + float(groups["ms"]) / 1000, count + 1)

    def nudge(self) -> None:
        """A real completion returned: the engine made progress whatever its log says."""
        self.progress += 1

    def sample(self) -> EngineSample:
        profile = self.profile
        knows = profile is not None and profile.log.knows_running and self.lines > 0
        return EngineSample(
            profile=f"{profile.name if profile else 'unknown'} log",
            running=float(sum(self.running.values())) if knows else None,
            waiting=None, generated=None,
            progress=float(self.progress) if profile else None,
            per_step=profile.log.per_step if profile else False,
            timing=self._timing if self._timing[1] else None)


class LogRefused(ScrapeError):
    """The log file is not one to read: not a regular file, a link, or someone else's. Each look says it again
    (the engine watch turns the first into a `log_refused` event)."""

    def __init__(self, detail: str) -> None:
        super().__init__("refused", detail)


def open_log(path: Path, owner: int | None) -> int:
    """A read-only descriptor of the regular file at `path`, opened as data: the engine's user writes that file
    (or the folder it is in), and could make it a FIFO (an open() that never returns), a device node (an open()
    with effects) or a link to another user's file. The path is looked at first with O_PATH, which opens
    nothing; only a regular file owned by root or by `owner` (the engine's user, when known) is then opened,
    through that very inode, non-blocking and never as a controlling terminal."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LogRefused(f"{path} is a symbolic link") from None
        raise ScrapeError("log", f"{path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISLNK(st.st_mode):
            raise LogRefused(f"{path} is a symbolic link")
        if not stat.S_ISREG(st.st_mode):
            raise LogRefused(f"{path} is not a regular file ({_file_type(st.st_mode)})")
        if owner is not None and st.st_uid not in (0, owner):
            raise LogRefused(f"{path} belongs to uid {st.st_uid}, not root or the engine's user (uid {owner})")
        try:  # /proc/self/fd/N is the inode checked above, whatever the path names now
            return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as exc:
            raise ScrapeError("log", f"{path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _file_type(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))
    return next((name for test, name in kinds if test(mode)), f"mode {mode:o}")


class FileLines:
    """New lines of a log file since the last look; a rotated or truncated file is read from its start. A line
    longer than MAX_LINE is passed over: one that never ends holds at most MAX_LINE bytes, never more."""

    def __init__(self, path: Path, owner: Callable[[], int | None] = lambda: None) -> None:
        self.path, self.owner = path, owner
        self._inode: int | None = None
        self._offset = 0
        self._partial = b""
        self._skipping = False  # inside a line already cut at MAX_LINE: drop up to its end

    def read(self) -> list[str]:
        fd = open_log(self.path, self.owner())
        try:
            st = os.fstat(fd)
            if self._inode is None:  # first look: only what comes from now on counts
                self._inode, self._offset = st.st_ino, st.st_size
            elif st.st_ino != self._inode or st.st_size < self._offset:
                self._inode, self._offset, self._partial, self._skipping = st.st_ino, 0, b"", False
            if st.st_size - self._offset > _MAX_READ:  # skipped past: what follows starts mid-line
                self._offset, self._partial, self._skipping = st.st_size - _MAX_READ, b"", True
            data = os.pread(fd, _MAX_READ, self._offset)
        except OSError as exc:
            raise ScrapeError("log", f"{self.path}: {exc.strerror or exc}") from None
        finally:
            os.close(fd)
        self._offset += len(data)
        return self._split(data)

    def _split(self, data: bytes) -> list[str]:
        *lines, rest = data.split(b"\n")
        if lines:
            head = b"" if self._skipping else self._partial + lines[0]
            lines[0], self._partial, self._skipping = head, b"", False
        if self._skipping or len(self._partial) + len(rest) > MAX_LINE:
            self._partial, self._skipping = b"", True
        else:
            self._partial += rest
        return [line.decode("utf-8", "replace") for line in lines if 0 < len(line) <= MAX_LINE]

    def close(self) -> None:
        pass


class JournalLines:
    """New entries of one systemd unit in the journal (`_SYSTEMD_UNIT`), from now on."""

    def __init__(self, unit: str, path: str | None = None) -> None:
        from systemd import journal

        self.unit = unit
        self._reader = journal.Reader(path=path) if path else journal.Reader()
        self._reader.add_match(_SYSTEMD_UNIT=unit)
        self._reader.seek_tail()
        self._reader.get_previous()  # seek_tail then one step back: the next read is the first new entry

    def read(self) -> list[str]:
        lines, size = [], 0
        while size < _MAX_READ and (entry := self._reader.get_next()):
            message = entry.get("MESSAGE", "")
            line = message.decode("utf-8", "replace") if isinstance(message, bytes) else str(message)
            lines.append(line)
            size += len(line)
        return lines

    def close(self) -> None:
        self._reader.close()


if TYPE_CHECKING:  # a name for the annotations only: DockerLines is imported where it is used (`of`)
    from gpuwarden.engine.dockerlog import DockerLines

    LineSource = FileLines | JournalLines | DockerLines


class LogScraper:
    """The log as a scraper: each `scrape()` reads the new lines and returns the reader's sample. The source is
    opened on the first look, so a journal that cannot be opened is a failed scrape, not a failed start."""

    def __init__(self, open_lines: Callable[[], LineSource], where: str, profile: str = "auto") -> None:
        self._open, self.where, self.reader = open_lines, where, LogReader(profile)
        self.lines: LineSource | None = None
        # one read in flight per scraper, not per path: engines may share a log file (or a FIFO put there)
        self._key = f"{where} ({id(self):x})"

    @classmethod
    def of(cls, file: Path | None, unit: str | None, profile: str = "auto", container: str | None = None,
           docker_socket: Path = Path("/var/run/docker.sock"),
           owner: Callable[[], int | None] = lambda: None) -> LogScraper:
        """`owner`: the engine's user as known now (None: not yet), whose log file alone is read."""
        if file:
            return cls(lambda: FileLines(file, owner), str(file), profile)
        if container:
            # Imported here: only an engine in a container has its log read from Docker (dockerlog.py, calendar)
            from gpuwarden.engine.dockerlog import DockerLines

            return cls(lambda: DockerLines(container, docker_socket), f"the Docker log of container {container}",
                       profile)
        return cls(lambda: JournalLines(unit), f"the journal of {unit}", profile)

    def _read(self) -> list[str]:
        if self.lines is None:
            try:
                self.lines = self._open()
            except (ImportError, OSError, ValueError) as exc:
                raise ScrapeError("log", f"cannot open {self.where}: {exc}") from None
        return self.lines.read()

    async def scrape(self) -> EngineSample:
        try:
            new = await _READS.run(self._key, _DEADLINE, self._read)
        except TimeoutError:
            raise ScrapeError("log", f"reading {self.where} took longer than {_DEADLINE:.0f} s") from None
        except Busy:
            raise ScrapeError("log", f"the last read of {self.where} has not returned yet") from None
        for line in new:
            self.reader.feed(line)
        return self.reader.sample()

    async def close(self) -> None:
        if self.lines is not None:
            self.lines.close()
