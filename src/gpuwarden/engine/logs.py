"""Progress from an engine's own log, for the same stall detector as /metrics.

`LogReader` is pure: lines in, an `EngineSample` out (progress counts the lines that prove tokens were
processed; running is what the last lines said). The sources are thin edges that hand it the lines written
since the last look: a file (followed across rotation and truncation), the journal of a systemd unit
(`_SYSTEMD_UNIT`), or a Docker container's log (engine/dockerlog.py). Each look is bounded in bytes and runs
off the event loop with a deadline.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable
from pathlib import Path

from gpuwarden.engine.dockerlog import DockerLines
from gpuwarden.engine.logprofiles import LOG_BY_NAME, LOG_PROFILES, LogProfile
from gpuwarden.engine.metrics import EngineSample
from gpuwarden.engine.scraper import ScrapeError

_MAX_READ = 4 << 20  # bytes read per look: a log flood is skipped past, not slurped
_DEADLINE = 5.0
# The lines the rules know are under 400 characters (tests/corpus/logs); a longer one carries someone's text and
# is passed over, which also bounds the rules' work per line.
MAX_RULE_LINE = 2048
# A terminal's colours (a Docker TTY, vLLM's coloured level) sit inside the prefix the rules are anchored to
_COLOUR = re.compile(r"\x1b\[[0-9;]{0,16}m")


class LogReader:
    def __init__(self, profile: str = "auto") -> None:
        self.profile: LogProfile | None = None if profile == "auto" else LOG_BY_NAME[profile]
        self.progress = 0
        self.running: dict[str, int] = {}  # per engine index or slot
        self.lines = 0  # lines a rule matched
        self._timing = (0.0, 0)  # finished requests' seconds, count
        self._moves: dict[tuple[str, str], str] = {}  # (key, group) -> its value in the last line

    def feed(self, line: str) -> None:
        if len(line) > MAX_RULE_LINE:
            return
        line = _COLOUR.sub("", line) if "\x1b" in line else line
        for profile in (self.profile,) if self.profile else LOG_PROFILES:
            for rule in profile.rules:
                match = rule.pattern.match(line)  # anchored: see logprofiles.py
                if match:
                    self.profile = profile  # auto: the first engine whose line is seen
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
        knows = profile is not None and profile.knows_running and self.lines > 0
        return EngineSample(
            profile=f"{profile.name if profile else 'unknown'} log",
            running=float(sum(self.running.values())) if knows else None,
            waiting=None, generated=None,
            progress=float(self.progress) if profile else None,
            per_step=profile.per_step if profile else False,
            timing=self._timing if self._timing[1] else None)


class FileLines:
    """New lines of a log file since the last look; a rotated or truncated file is read from its start."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._inode: int | None = None
        self._offset = 0
        self._partial = b""

    def read(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if self._inode is None:  # first look: only what comes from now on counts
                    self._inode, self._offset = st.st_ino, st.st_size
                elif st.st_ino != self._inode or st.st_size < self._offset:
                    self._inode, self._offset, self._partial = st.st_ino, 0, b""
                if st.st_size - self._offset > _MAX_READ:
                    self._offset, self._partial = st.st_size - _MAX_READ, b""
                f.seek(self._offset)
                data = f.read(_MAX_READ)
        except OSError as exc:
            raise ScrapeError("log", f"{self.path}: {exc.strerror or exc}") from None
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        return [line.decode("utf-8", "replace") for line in lines]

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


LineSource = FileLines | JournalLines | DockerLines


class LogScraper:
    """The log as a scraper: each `scrape()` reads the new lines and returns the reader's sample. The source is
    opened on the first look, so a journal that cannot be opened is a failed scrape, not a failed start."""

    def __init__(self, open_lines: Callable[[], LineSource], where: str, profile: str = "auto") -> None:
        self._open, self.where, self.reader = open_lines, where, LogReader(profile)
        self.lines: LineSource | None = None

    @classmethod
    def of(cls, file: Path | None, unit: str | None, profile: str = "auto", container: str | None = None,
           docker_socket: Path = Path("/var/run/docker.sock")) -> LogScraper:
        if file:
            return cls(lambda: FileLines(file), str(file), profile)
        if container:
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
            new = await asyncio.wait_for(asyncio.to_thread(self._read), _DEADLINE)
        except TimeoutError:
            raise ScrapeError("log", f"reading {self.where} took longer than {_DEADLINE:.0f} s") from None
        for line in new:
            self.reader.feed(line)
        return self.reader.sample()

    async def close(self) -> None:
        if self.lines is not None:
            self.lines.close()
