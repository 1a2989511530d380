"""Saved kernel logs in the formats people paste, turned into KernelRecords.

Handles plain `dmesg`, `dmesg -T`, `dmesg --time-format iso`, `dmesg -x` level prefixes, `dmesg -H`
relative stamps, syslog/journal short and short-precise formats (any month language), `journalctl -o
short-iso`, `journalctl -o json`, raw /dev/kmsg records with dictionary lines, indented continuation
lines, lines without a timestamp, `grep -H` file-name prefixes, and newest-first output (`journalctl -r`)
with `-- Reboot --` markers.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime

from gpuwarden.kernel.records import KernelRecord, MalformedRecord, parse_kmsg, pci_from_device_field
from gpuwarden.kernel.rules import DRIVER_PREFIX, DRIVER_START, USER_TEXT_TAIL

_LEVEL_PREFIX = re.compile(
    r"^(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|local\d)\s*:"
    r"\s*(?:emerg|alert|crit|err|warn|notice|info|debug)\s*: ")
_PRINTK_LEVEL = re.compile(r"^(?:\s*<\d>)+ ?")
_MONO = re.compile(r"^\[\s*(\d+\.\d+)\](?:\[\s*[TC]\d+\])? ?")
_KERNEL_IDENT = re.compile(r"^kernel: ")
_TALOS = re.compile(r"^\S+: kern: +\w+: \[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:?\d\d)?\]: ")
_RELATIVE = re.compile(r"^\[\s*\+\s*(\d+\.\d+)\] ?")
_RELATIVE_BASE = re.compile(r"^\[(?:[A-Z][a-z]{2}\d{1,2} )?(\d\d):(\d\d)\] ?")
# `dmesg -T`: strftime "%a %b %e %H:%M:%S %Y" in the reader's locale (`[Tue Jan 27 …]`, `[二 1月 27 …]`,
# `[mar. janv. 27 …]`); a stamp strptime cannot read leaves the record without a time
_CTIME = re.compile(r"^\[([^\s\]]+ [^\s\]]+ [ \d]\d \d\d:\d\d:\d\d \d{4})\] ?")
_ISO = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:([,.])(\d+))?(Z|[+-]\d\d:?\d\d)? ")
_SYSLOG = re.compile(r"^[^\W\d_]{3,10}\.? {1,2}(\d{1,2}) (\d\d):(\d\d):(\d\d(?:\.\d+)?) ")
# `[host ]ident[pid]: `; the host may be empty (a journal line whose host field is blank: `Jan 02 21:35:19  kernel: `)
_IDENT = re.compile(r"^(?:(?P<host>\S*) )??(?P<ident>[^\s:\[]+)(?P<pid>\[\d+\])?: ")
_KMSG = re.compile(r"^\d+,\d+,\d+,[^;]*;")
# `grep -r` / `grep -H` output names the file before each line (`/var/log/syslog:Sep 18 ...`, with -n also the
# line number): stripped when what follows starts as a log line does
_GREP_FILE = re.compile(r"^/[^\s:]+:(?:\d+[:-])?(?=\[|\d{4}-|[^\W\d_]{3,10}\.? {1,2}\d|kernel: |<\d>)")
_SEPARATOR = re.compile(r"^-- (?:Reboot|Boot \S+|Logs begin at .*|Journal begins at .*|No entries) --$")
# A kernel record that holds a newline is printed, where each line gets its own prefix (the console, /proc/kmsg
# and so syslog's kern.log, `dmesg -S`), as lines with the same stamp. Two such splits are read back as one record:
# a driver's prefix alone (old powerplay's "amdgpu: [powerplay] " then "\n failed to send message %x ret is %d"),
# and the end of a task's name (15 bytes) before the fixed words of a line that carries one (`<comm>[pid]:
# segfault at`, classifier.user_text): a name with a newline then reads as a name, never as a line of its own.
_BARE_PREFIX = re.compile(rf"{DRIVER_PREFIX}\s*$")
_DRIVER_START = re.compile(DRIVER_START)
_NAME_END = re.compile(r"^(?P<end>.{0,14}?)(?:\[\d+\]:? | \(\d+\): |: page allocation failure| invoked oom-killer)")
_COMM_LEN = 15
# and the lines of a file name with newlines, between a fault's head and the mapping that ends its record
_FAULT_HEAD = re.compile(r"\]:? (?:segfault at |trap |general protection fault )|^traps: ")
_FAULT_TAIL = re.compile(USER_TEXT_TAIL)
_SPLIT_LINES = 8  # lines of one record joined back at most
# Text pasted into a report (`gpuwarden replay`): mail/markdown quotes, and a line the paste wrapped (a long line
# followed by one that starts like no log line)
_QUOTE = re.compile(r"^[ \t]*(?:>[ \t]?)+")
_WRAPPED_AT = 76
_NOT_WRAPPED = re.compile(r"^(?:[\[\].$#>-]|\.\.\.)")


@dataclass(eq=False, repr=False)
class ParseResult:
    """Records parsed from text, and the lines that were not."""

    records: list[KernelRecord] = field(default_factory=list)
    malformed: int = 0
    skipped: int = 0  # lines from other programs than the kernel


def parse_lines(lines: Iterable[str], *, pasted: bool = False) -> ParseResult:
    """All kernel records in a saved log, oldest first.

    `pasted`: the text was pasted into a report (`gpuwarden replay`), not written by a logger: `> ` quotes and the
    block's common indentation are removed, and a long line the paste wrapped is joined again. A followed file
    (`source = "file"`) is read as its logger wrote it.
    """
    result = ParseResult()
    relative = 0.0
    previous = ""  # the previous line, for a wrap
    for line in _unpasted(lines) if pasted else (raw.rstrip("\r\n") for raw in lines):
        if not line.strip():
            continue
        if line[0] in " \t" and result.records:
            _continue(result, line)
            continue
        if _SEPARATOR.match(line):
            continue
        try:
            record = _parse_one(line, relative)
        except MalformedRecord:
            result.malformed += 1
            continue
        if record is None:
            result.skipped += 1
            continue
        if pasted and _wrapped(result.records, previous, record):
            last = result.records[-1]
            result.records[-1] = replace(last, text=f"{last.text} {record.text}")
            previous = line
            continue
        previous = line
        if record.timestamp is not None:  # `dmesg -H` deltas count from the previous stamp
            relative = record.timestamp
        result.records.append(_rejoin(result.records, record))
    if _newest_first(result.records):
        result.records.reverse()
    return result


def _unpasted(lines: Iterable[str]) -> list[str]:
    """The lines of a pasted block as the log had them: quotes off, the block's common indentation off (the
    indentation of dmesg's continuation lines beyond it is kept: they continue a record)."""
    out = [raw.rstrip("\r\n") for raw in lines]
    out = [_QUOTE.sub("", line, count=1) if line.lstrip(" \t").startswith(">") else line for line in out]
    indents = [line[:len(line) - len(line.lstrip(" \t"))] for line in out if line.strip()]
    cut = len(os.path.commonprefix(indents)) if indents else 0  # noqa: RUF071 (by character: the whitespace)
    return [line[cut:] for line in out]


def _wrapped(records: list[KernelRecord], previous: str, record: KernelRecord) -> bool:
    """A line the paste wrapped: after a long stamped line, one with no stamp that starts like no log line."""
    return bool(records) and records[-1].timestamp is not None and record.timestamp is None \
        and len(previous) >= _WRAPPED_AT and record.text == record.text.lstrip() \
        and not _NOT_WRAPPED.match(record.text) and not _BARE_PREFIX.match(record.text) \
        and _DRIVER_START.match(record.text) is None


def _rejoin(records: list[KernelRecord], record: KernelRecord) -> KernelRecord:
    """`record` with the lines a split record left before it (same stamp) joined back in, taken off `records`:
    a driver's prefix printed alone, a fault's lines from its head to the mapping that ends it, or the start of a
    task's name (see _BARE_PREFIX)."""
    if not records or records[-1].timestamp != record.timestamp:
        return record
    if (bare := _bare_prefix(records[-1].text)) is not None:
        records.pop()
        return replace(record, text=f"{bare}\n{record.text}")
    if (last := record.text.rfind("[")) >= 0 and _FAULT_TAIL.match(record.text, last) \
            and not _FAULT_HEAD.search(record.text):
        start = len(records)  # back to the fault's head, all of one stamp
        while start > 0 and len(records) - start < _SPLIT_LINES and records[start - 1].timestamp == record.timestamp:
            start -= 1
            if _FAULT_HEAD.search(records[start].text):
                text = "\n".join([*(r.text for r in records[start:]), record.text])
                del records[start:]
                return replace(record, text=text)
    if (m := _NAME_END.match(record.text)) is None:
        return record
    used, text = len(m.group("end")), record.text
    while records and records[-1].timestamp == record.timestamp and used + 1 + len(records[-1].text) <= _COMM_LEN:
        used += 1 + len(records[-1].text)
        text = f"{records.pop().text}\n{text}"
    return replace(record, text=text) if text is not record.text else record


def _continue(result: ParseResult, line: str) -> None:
    """An indented line: a dictionary entry of a raw /dev/kmsg record, or the rest of the previous multi-line
    message (dmesg indents a record's next lines: text a user chose, a file name's, may look like an entry)."""
    last = result.records[-1]
    stripped = line.strip()
    key = stripped.split("=", 1)[0] if last.seq is not None and "=" in stripped else ""
    if key == "DEVICE":
        result.records[-1] = replace(last, device=pci_from_device_field(stripped[7:]))
    elif key == "SUBSYSTEM":
        result.records[-1] = replace(last, subsystem=stripped[10:])
    elif key.isupper() and key.isalpha():
        pass  # another kmsg dictionary entry (SOURCE=...)
    else:
        bare = _bare_prefix(last.text)
        result.records[-1] = replace(last, text=f"{last.text if bare is None else bare}\n{stripped}")


def _bare_prefix(text: str) -> str | None:
    """`text` when it is a driver's prefix printed alone (the rest of the record on the next line), with the space
    the prefix ends with: a paste drops a line's trailing spaces (`amdgpu:` for amdgpu.h's pr_fmt "amdgpu: " before
    old powerplay's "\\n failed to send message %x ret is %d \\n"); None when it is not one."""
    if _BARE_PREFIX.match(text):
        return text
    return f"{text} " if text.endswith(":") and _BARE_PREFIX.match(f"{text} ") else None


def _parse_one(line: str, relative: float) -> KernelRecord | None:
    if line[0] == "/" and (m := _GREP_FILE.match(line)):
        line = line[m.end():]
    if line.startswith('{"'):  # journalctl -o json; `{7}[Hardware Error]: ...` (APEI) is text
        return _from_json(line)
    if _KMSG.match(line):
        return parse_kmsg(line)
    if m := _LEVEL_PREFIX.match(line):
        line = line[m.end():]
    if m := _PRINTK_LEVEL.match(line):
        line = line[m.end():]
    if m := _KERNEL_IDENT.match(line):
        return _kernel_text(line[m.end():], None)
    if m := _TALOS.match(line):
        date, fraction, zone = m.groups()
        fraction = f".{fraction[:6]}" if fraction else ""
        return _kernel_text(line[m.end():], datetime.fromisoformat(f"{date}{fraction}{_iso_zone(zone)}").timestamp())
    if m := _MONO.match(line):
        return KernelRecord(line[m.end():], float(m.group(1)))
    if m := _RELATIVE.match(line):
        return KernelRecord(line[m.end():], relative + float(m.group(1)))
    if m := _RELATIVE_BASE.match(line):
        return KernelRecord(line[m.end():], int(m.group(1)) * 3600 + int(m.group(2)) * 60.0)
    if m := _CTIME.match(line):
        try:
            stamp = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y").timestamp()
        except ValueError:
            stamp = None
        return KernelRecord(line[m.end():], stamp)
    if m := _ISO.match(line):
        date, sep, fraction, zone = m.groups()
        stamp = datetime.fromisoformat(f"{date}{'.' + fraction if fraction else ''}{_iso_zone(zone)}").timestamp()
        if sep == ",":  # dmesg --time-format iso: the kernel's text follows directly
            return KernelRecord(line[m.end():], stamp)
        return _journal_line(line[m.end():], stamp)
    if m := _SYSLOG.match(line):
        day, hh, mm, ss = m.groups()
        return _journal_line(line[m.end():], int(day) * 86400 + int(hh) * 3600 + int(mm) * 60 + float(ss))
    return KernelRecord(line)


def _iso_zone(zone: str | None) -> str:
    if not zone or zone == "Z":
        return "+00:00" if zone else ""
    return zone if ":" in zone else f"{zone[:3]}:{zone[3:]}"


def _journal_line(rest: str, stamp: float) -> KernelRecord | None:
    """`[host ]kernel: text` -> the kernel's text; lines of other programs are not kernel records.

    A line with neither host nor `[pid]` (`Sep 18 20:07:01 NVRM: Xid ...`) is grep output of the kernel log.
    """
    m = _IDENT.match(rest)
    if not m:
        return _kernel_text(rest, stamp)
    if m.group("ident") == "kernel":
        return _kernel_text(rest[m.end():], stamp)
    return _kernel_text(rest, stamp) if not m.group("host") and m.group("pid") is None else None


def _kernel_text(text: str, stamp: float | None) -> KernelRecord:
    """The kernel's message, whose own `[ 12.345678]` stamp (kept by syslog and some journals) wins."""
    if m := _PRINTK_LEVEL.match(text):
        text = text[m.end():]
    if m := _MONO.match(text):
        return KernelRecord(text[m.end():], float(m.group(1)))
    return KernelRecord(text, stamp)


def _from_json(line: str) -> KernelRecord | None:
    try:
        entry = json.loads(line)
        message = entry["MESSAGE"]
    except (ValueError, KeyError, TypeError):
        raise MalformedRecord(line[:200]) from None
    if entry.get("_TRANSPORT", "kernel") != "kernel":
        return None
    if isinstance(message, list):  # journalctl writes non-UTF-8 messages as byte arrays
        message = bytes(message).decode("utf-8", "replace")
    stamp = entry.get("_SOURCE_MONOTONIC_TIMESTAMP") or entry.get("__MONOTONIC_TIMESTAMP")
    device = entry.get("_KERNEL_DEVICE") or entry.get("_UDEV_SYSNAME")
    facility = entry.get("SYSLOG_FACILITY")
    return KernelRecord(
        text=str(message),
        timestamp=int(stamp) / 1e6 if stamp else None,
        device=pci_from_device_field(device) if device else None,
        cursor=entry.get("__CURSOR"),
        metadata=True,
        facility=int(facility) if str(facility).isdigit() else (None if facility is None else 1),
        subsystem=entry.get("_KERNEL_SUBSYSTEM"),
    )


def _newest_first(records: list[KernelRecord]) -> bool:
    stamps = [r.timestamp for r in records if r.timestamp is not None]
    steps = [b - a for a, b in itertools.pairwise(stamps) if b != a]
    return bool(steps) and sum(s < 0 for s in steps) > len(steps) / 2
