"""The Prometheus text exposition (format 0.0.4) of the daemon's self-metrics and of its process, written straight
from a snapshot: byte for byte what prometheus_client's generate_latest wrote, without its registry, collectors
and metric objects (0.88 ms of each scrape for 165 lines) nor its import (a few MB held by every daemon).

Pure, but for `Process`, which reads /proc/self the way prometheus_client's ProcessCollector did.
"""

from __future__ import annotations

import os
import resource

from gpuwarden.core.families import FAMILIES, Family
from gpuwarden.runtime.procfs import read_small

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_HEADS: dict[str, str] = {}  # name -> its "# HELP" and "# TYPE" lines, made once
_SERIES: dict[tuple[str, tuple[str, ...]], str] = {}  # (name, label values) -> its name and labels, written once
_MAX_SERIES = 4096
_LAST: dict[str, tuple[dict, str]] = {}  # name -> the series it was last written from, and the text written
_INF = float("inf")


def render(snapshot: dict[str, dict[tuple[str, ...], float]], process: str = "") -> bytes:
    """The declared families present in `snapshot` (values keyed by label values: the snapshot's own copies, kept
    to compare with the next), in declaration order, each series in label-value order, then `process`."""
    out = []
    for name, family in FAMILIES.items():
        if (series := snapshot.get(name)) is None:
            continue
        last = _LAST.get(name)
        if last is not None and last[0] == series:  # most families do not move between two scrapes
            out.append(last[1])
            continue
        text = _family(name, family, series)
        _LAST[name] = (series, text)
        out.append(text)
    out.append(process)
    # a label value from a path or a process, decoded with surrogateescape, cannot be UTF-8: a "?" in its series
    # rather than every scrape failing
    return "".join(out).encode(errors="replace")


def _family(name: str, family: Family, series: dict[tuple[str, ...], float]) -> str:
    if (head := _HEADS.get(name)) is None:
        head = _HEADS[name] = _head(name, family.kind, family.doc)
    if not family.labels:
        return head + "".join(f"{name} {number(value)}\n" for value in series.values())
    lines = [head]
    for values, value in sorted(series.items()):
        if (prefix := _SERIES.get((name, values))) is None:
            prefix = _series(name, family.labels, values)
        lines.append(f"{prefix} {number(value)}\n")
    return "".join(lines)


def _series(name: str, keys: tuple[str, ...], values: tuple[str, ...]) -> str:
    """`name{label="value",...}`, label names sorted as prometheus_client sorts them; kept, as a scrape writes the
    same series again and again (the cache is emptied when full: series of engines and GPUs come and go)."""
    if len(_SERIES) >= _MAX_SERIES:
        _SERIES.clear()
    pairs = ",".join(f'{key}="{escape(value)}"' for key, value in sorted(zip(keys, values, strict=True)))
    prefix = _SERIES[name, values] = f"{name}{{{pairs}}}"
    return prefix


def _head(name: str, kind: str, doc: str) -> str:
    return f"# HELP {name} {doc.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}\n# TYPE {name} {kind}\n"


def escape(value: str) -> str:
    """A label value as the format quotes it: backslash, newline and double quote escaped."""
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def number(value: float) -> str:
    """As prometheus_client's floatToGoString: repr, but Go's exponent form for large values (1.796e+09)."""
    text = repr(float(value))
    if value != value:
        return "NaN"
    if value == _INF or value == -_INF:
        return "+Inf" if value > 0 else "-Inf"
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


class Process:
    """process_* as ProcessCollector gave them: one read of /proc/self/stat and one stat() of /proc/self/fd a
    scrape (its size is the number of open descriptors since Linux 6.2: a listdir of it cost 100 µs with the
    daemon's ~150 open, the kernel making an entry for each; listed where the size says nothing, the listing's
    own descriptor not counted); the start time, the system's constants and the fixed text made once."""

    def __init__(self, proc: str = "/proc") -> None:
        self._proc = proc
        self._tick, self._page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
        self._start: str | None = None  # its start time's lines

    def render(self) -> str:
        try:
            # the fields after the command, which may hold spaces and ')'
            fields = read_small(f"{self._proc}/self/stat", 4096).rsplit(b")", 1)[1].split()
            tick = self._tick
            if self._start is None:
                self._start = _START + f"{number(self._boot() + int(fields[19]) / tick)}\n"
            fds = os.stat(f"{self._proc}/self/fd").st_size or len(os.listdir(f"{self._proc}/self/fd")) - 1
            text = (f"{_VIRTUAL}{number(float(fields[20]))}\n{_RESIDENT}{number(float(int(fields[21]) * self._page))}"
                    f"\n{self._start}{_CPU}{number(int(fields[11]) / tick + int(fields[12]) / tick)}\n"
                    f"{_FDS}{number(float(fds))}\n")
        except (OSError, IndexError, ValueError):
            return ""  # no /proc (a container without it): no process_* rather than no metrics
        # getrlimit: the soft limit /proc/self/limits says, without reading and parsing that file
        return f"{text}{_MAX_FDS}{number(float(resource.getrlimit(resource.RLIMIT_NOFILE)[0]))}\n"

    def _boot(self) -> float:
        with open(f"{self._proc}/stat", "rb") as f:
            return float(next(line.split()[1] for line in f if line.startswith(b"btime ")))


def _gauge(name: str, doc: str) -> str:
    """A gauge's head and its name, its value to follow."""
    return f"# HELP {name} {doc}\n# TYPE {name} gauge\n{name} "


_VIRTUAL = _gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.")
_RESIDENT = _gauge("process_resident_memory_bytes", "Resident memory size in bytes.")
_START = _gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.")
_CPU = ("# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
        "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total ")
_FDS = _gauge("process_open_fds", "Number of open file descriptors.")
_MAX_FDS = _gauge("process_max_fds", "Maximum number of open file descriptors.")
