"""An engine's log from its Docker container: the Engine API's `GET /containers/{id}/logs`, followed.

The stream of a container without a TTY multiplexes stdout and stderr: each log message is one frame, an
8-byte header (the stream: 1 stdout, 2 stderr; three zero bytes; the payload's length, big-endian) and the
payload. With a TTY the log is the terminal's bytes as they came (lines end in CRLF). With `timestamps=1`
each message starts with its RFC 3339 time at fixed width (nanoseconds), which is where a new connection
resumes (`since`, inclusive: messages at or before the last one seen are dropped).

`Frames` and `Lines` are pure (bytes in, lines out); `DockerLines` is the thin edge a LogScraper reads: each
look drains what arrived on the connection without waiting, at most _MAX_READ bytes, and a connection that
ended (the container stopped or was replaced) is opened again on the next look.
"""

from __future__ import annotations

import calendar
import json
import re
import socket
import time
from pathlib import Path

from gpuwarden.engine.dockerapi import DockerError, error_of, inspect, open_stream
from gpuwarden.engine.scraper import ScrapeError

_MAX_READ = 4 << 20  # bytes per look, as for a file
_MAX_LINE = 1 << 20  # a longer line is cut: no log line of an engine comes near it
_STAMP = re.compile(rb"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z ")


class Frames:
    """Multiplexed frames in, (stream, payload) out; a frame split across reads waits for its rest, and past
    _MAX_LINE the rest of a frame is passed over as it comes."""

    def __init__(self) -> None:
        self._pending = b""
        self._skip = 0  # bytes of an oversized frame still to pass over

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        if self._skip:
            passed = min(self._skip, len(data))
            self._skip, data = self._skip - passed, data[passed:]
        buf, out, at = self._pending + data, [], 0
        while not self._skip and len(buf) - at >= 8:
            kind, size = buf[at], int.from_bytes(buf[at + 4:at + 8], "big")
            if kind > 2 or buf[at + 1:at + 4] != b"\0\0\0":
                raise ValueError(f"not a Docker multiplexed log stream (header {buf[at:at + 8].hex()})")
            take = min(size, _MAX_LINE)
            if len(buf) - at - 8 < take:
                break
            out.append((kind, buf[at + 8:at + 8 + take]))
            at += 8 + take
            passed = min(size - take, len(buf) - at)
            at, self._skip = at + passed, size - take - passed
        self._pending = buf[at:] if not self._skip else b""
        return out


def stamp(message: bytes) -> tuple[tuple[int, int] | None, bytes]:
    """A message's time (seconds, nanoseconds since the epoch) and the message without it."""
    m = _STAMP.match(message)
    if not m:
        return None, message
    seconds = calendar.timegm(time.strptime(m.group(1).decode(), "%Y-%m-%dT%H:%M:%S"))
    return (seconds, int((m.group(2) or b"0").ljust(9, b"0"))), message[m.end():]


class Lines:
    """Messages in, whole lines out: per stream, since stdout and stderr interleave; a partial line (a message
    cut at Docker's 16 KB, whose pieces share one time; a TTY write) waits for its end. After `resume()`, the
    messages up to the last one taken are dropped: they come again on a new connection."""

    def __init__(self) -> None:
        self.after: tuple[int, int] | None = None  # the time of the last message taken
        self._seen: tuple[int, int] | None = None  # resumed: drop messages up to this time
        self._partial: dict[int, bytes] = {}
        self._tty = b""

    def resume(self) -> None:
        """A new connection: what it sends up to the last message taken was taken; lines cut by the old one's
        end are dropped (their rest comes at that same time)."""
        self._seen, self._partial, self._tty = self.after, {}, b""

    def messages(self, stream: int, messages: list[bytes]) -> list[str]:
        out = []
        for message in messages:
            when, text = stamp(message)
            if when is not None:
                if self._seen is not None and when <= self._seen:
                    continue
                self._seen, self.after = None, when
            *whole, rest = (self._partial.get(stream, b"") + text).split(b"\n")
            self._partial[stream] = rest[-_MAX_LINE:]
            out += [line.rstrip(b"\r").decode("utf-8", "replace") for line in whole]
        return out

    def raw(self, data: bytes) -> list[str]:
        """A TTY's stream: no frames, each message a line with its time in front."""
        *whole, rest = (self._tty + data).split(b"\n")
        self._tty = rest[-_MAX_LINE:]
        return self.messages(0, [line + b"\n" for line in whole])


class DockerLines:
    """New lines of a container's log since the last look, from now on (`tail=0`), followed."""

    def __init__(self, container: str, socket_path: Path) -> None:
        self.container, self.socket_path = container, socket_path
        self._sock: socket.socket | None = None
        self._lines = Lines()
        self._frames: Frames | None = None  # None: a TTY's raw stream

    def _open(self) -> bytes:
        info = inspect(self.socket_path, self.container)
        if self._lines.after is None:  # the first look: from now on, and a later connection resumes from here
            query, now = "tail=0", time.time_ns()
            self._lines.after = (now // 10**9, now % 10**9)
        else:
            query = "since={}.{:09d}".format(*self._lines.after)
        self._lines.resume()
        status, sock, body = open_stream(
            self.socket_path, f"/containers/{info['Id']}/logs?follow=1&stdout=1&stderr=1&timestamps=1&{query}")
        if status != 200:
            with sock:
                body += sock.recv(65536)
            raise DockerError(f"container {self.container}: logs: {error_of(status, _json(body))}")
        self._sock = sock
        self._frames = None if info.get("Config", {}).get("Tty") else Frames()
        return body

    def read(self) -> list[str]:
        try:
            data = self._open() if self._sock is None else b""
            data, ended = self._drain(data)
        except (DockerError, OSError) as exc:
            self.close()
            raise ScrapeError("log", str(exc)) from None
        try:
            lines = self._parse(data)
        except ValueError as exc:
            self.close()
            raise ScrapeError("log", f"container {self.container}: {exc}") from None
        if ended:
            self.close()  # stopped or gone: the next look connects again, from the last message taken
        return lines

    def _drain(self, data: bytes) -> tuple[bytes, bool]:
        """What has arrived, without waiting; True when the stream ended."""
        self._sock.setblocking(False)
        chunks, size = [data], len(data)
        while size < _MAX_READ:
            try:
                chunk = self._sock.recv(min(1 << 20, _MAX_READ - size))
            except (BlockingIOError, InterruptedError):
                return b"".join(chunks), False
            if not chunk:
                return b"".join(chunks), True
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks), False

    def _parse(self, data: bytes) -> list[str]:
        if self._frames is None:
            return self._lines.raw(data)
        lines = []
        for stream, payload in self._frames.feed(data):
            lines += self._lines.messages(stream, [payload])
        return lines

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _json(body: bytes) -> object:
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")
