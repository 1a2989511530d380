"""The kernel-line classifier: records in, events out. Pure: the caller passes the time.

- The first matching rule names the kind; Xid lines take severity and meaning from the Xid catalog.
- A burst of lines with the same kind, severity, subject (and Xid) within `storm_window` seconds of the
  previous one (in log time) is one event whose count grows; a burst that lasts `max_burst` seconds starts
  a new event. `flush` closes bursts that saw no line for `storm_window` (in the caller's time).
- Oops reports span many lines: they are collected until they end, then judged by whether a GPU driver
  is in the trace.
- A benign line costs one Aho-Corasick scan for the rules' literal hints; only lines that hold one are
  matched against the rules' expressions. Rules without hints (those from the config) are tried on every line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import ahocorasick

from gpuwarden.kernel import xid as xid_catalog
from gpuwarden.kernel.records import KernelRecord
from gpuwarden.kernel.rules import (
    ESCALATIONS,
    FRAME,
    GPU_DRIVERS,
    GPU_MODULES,
    OOPS_END,
    OOPS_HEADERS,
    OOPS_HINTS,
    RULES,
    Rule,
)
from gpuwarden.model import Event, Severity, normalize_pci

_PREFIX = re.compile(r"^\s*([\w-]+) ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): ")
_NVRM_PCI = re.compile(r"(?:\(PCI:|GPU at PCI:|NVRM: GPU |NVIDIA GPU )"
                       r"([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)")
_FRAME = re.compile(FRAME)
_OOPS_HEADERS = [(re.compile(p), s) for p, s in OOPS_HEADERS]
_OOPS_END = re.compile(OOPS_END)
_OOPS_LINES = 120  # an oops report longer than this is cut and judged on what was seen


@dataclass
class Burst:
    """One event standing for a burst of lines; `row_id` is set by whoever stores the event."""

    event: Event
    first: float  # log time
    last: float  # log time
    arrived: float  # caller's time of the latest line
    count: int = 1
    row_id: int | None = None

    @property
    def final(self) -> Event:
        return replace(self.event, count=self.count)


class Flushed(NamedTuple):
    new: list[Burst]  # events that only a closed report could make (oops)
    grown: list[Burst]  # closed bursts that counted more than one line: update their stored count


@dataclass
class _Oops:
    severity: Severity | None  # None: a call trace seen without its header
    lines: list[str] = field(default_factory=list)
    gpu_modules: set[str] = field(default_factory=set)
    gpu: str | None = None
    last: float = 0.0  # log time
    arrived: float = 0.0  # caller's time


class Classifier:
    def __init__(
        self,
        rules: tuple[Rule, ...] = RULES,
        *,
        extra_rules: tuple[Rule, ...] = (),
        severity_overrides: dict[str, Severity] | None = None,
        xid_overrides: dict[int, Severity] | None = None,
        storm_window: float = 2.0,
        max_burst: float = 60.0,
    ) -> None:
        self._rules = [(re.compile(r.pattern), r) for r in (*extra_rules, *rules)]
        self._unhinted = [(regex, r) for regex, r in self._rules if not r.hints]
        self._gate = ahocorasick.Automaton()
        for hint in {h for r in rules for h in r.hints} | set(OOPS_HINTS):
            self._gate.add_word(hint, hint)
        self._gate.make_automaton()
        self._severity_overrides = severity_overrides or {}
        self._xid_overrides = xid_overrides or {}
        self.storm_window = storm_window
        self.max_burst = max_burst
        self._bursts: dict[tuple, Burst] = {}
        self._recent: dict[tuple[str, str], float] = {}  # (kind, gpu) -> last time, for escalations
        self._oops: _Oops | None = None
        self.lines = 0

    def feed(self, record: KernelRecord, now: float) -> list[Burst]:
        """Classify one record; returns the bursts that this record started (new events)."""
        self.lines += 1
        text = record.text
        stamp = record.timestamp if record.timestamp is not None else now
        out: list[Burst] = []
        if self._oops and stamp - self._oops.last > self.storm_window:
            out += self._close_oops(now)
        gated = next(self._gate.iter(text), None) is not None
        if not gated and not self._unhinted:
            return out
        if gated and (self._oops or _FRAME.search(text) or any(r.search(text) for r, _ in _OOPS_HEADERS)):
            oops_done = self._oops_line(text, record, stamp, now)
            if oops_done is not None:
                out += oops_done
                return out
        for regex, rule in self._rules if gated else self._unhinted:
            m = regex.search(text)
            if m:
                burst = self._event(rule, m, record, stamp, now)
                if burst:
                    out.append(burst)
                break
        return out

    def flush(self, now: float, *, everything: bool = False) -> Flushed:
        """Close bursts and oops reports that ended (`everything`: all of them, at the end of a replay).

        `now` is on the clock of `feed`'s `now`.
        """
        grown = []
        for key, burst in list(self._bursts.items()):
            if everything or now - burst.arrived > self.storm_window:
                del self._bursts[key]
                if burst.count > 1:
                    grown.append(burst)
        new = []
        if self._oops and (everything or now - self._oops.arrived > self.storm_window):
            new = self._close_oops(now)
        return Flushed(new, grown)

    # --- one-line events -------------------------------------------------------------------------

    def _event(self, rule: Rule, m: re.Match[str], record: KernelRecord, stamp: float, now: float) -> Burst | None:
        gpu, device = _attribute(record, rule.vendor)
        severity, meaning, xid = rule.severity, rule.meaning, None
        if rule.kind == "xid":
            xid = int(m.group("xid"))
            severity, meaning = xid_catalog.describe(xid)
            severity = self._xid_overrides.get(xid, severity)
            meaning = f"Xid {xid}: {meaning}"
        evidence = {"line": record.text, "rule": rule.name, "runbook": rule.runbook, "vendor": rule.vendor}
        if xid is not None:
            evidence["xid"] = xid
        if device:
            evidence["pci"] = device
        if record.timestamp is not None:
            evidence["log_time"] = record.timestamp
        if gpu:
            severity = self._escalate(rule.kind, gpu, stamp, severity, evidence)
            self._recent[(rule.kind, gpu)] = stamp
        severity = self._severity_overrides.get(rule.kind, severity)
        key = (rule.kind, severity, gpu or device, xid)
        burst = self._bursts.get(key)
        if burst and stamp - burst.last <= self.storm_window and stamp - burst.first <= self.max_burst:
            burst.count += 1
            burst.last, burst.arrived = stamp, now
            return None
        subject = f" on {gpu}" if gpu else (f" at {device}" if device else "")
        event = Event(kind=rule.kind, severity=severity, message=f"{meaning}{subject}", time=now, gpu=gpu,
                      evidence=evidence)
        burst = self._bursts[key] = Burst(event, stamp, stamp, now)
        return burst

    def _escalate(self, kind: str, gpu: str, stamp: float, severity: Severity, evidence: dict) -> Severity:
        for rule in ESCALATIONS:
            seen = self._recent.get((rule.after, gpu))
            if rule.kind == kind and seen is not None and 0 <= stamp - seen <= rule.within_seconds:
                evidence["escalated"] = rule.why
                severity = max(severity, rule.severity)
        return severity

    # --- oops reports ----------------------------------------------------------------------------

    def _oops_line(self, text: str, record: KernelRecord, stamp: float, now: float) -> list[Burst] | None:
        """Feed a line to the open oops report; None when the line is not part of one."""
        header = next((sev for regex, sev in _OOPS_HEADERS if regex.search(text)), None)
        frames = _FRAME.findall(text)
        if self._oops is None:
            if header is None and not frames:
                return None
            self._oops = _Oops(severity=header)
        oops = self._oops
        if header is not None:
            oops.severity = max(oops.severity or header, header)
        oops.lines.append(text)
        oops.gpu_modules.update(m for m in frames if m in GPU_MODULES)
        oops.gpu = oops.gpu or _attribute(record, "kernel")[0]
        oops.last, oops.arrived = stamp, now
        if _OOPS_END.search(text) or len(oops.lines) >= _OOPS_LINES:
            return self._close_oops(now)
        return []

    def _close_oops(self, now: float) -> list[Burst]:
        oops, self._oops = self._oops, None
        if oops is None:
            return []
        if oops.gpu_modules:
            severity = oops.severity if oops.severity is not None else Severity.WARNING
            what = f"kernel oops in {', '.join(sorted(oops.gpu_modules))}"
        elif oops.severity == Severity.CRITICAL:
            severity, what = Severity.WARNING, "kernel oops outside the GPU drivers"
        else:
            return []  # a warning or a stack dump that no GPU driver is part of: not ours
        severity = self._severity_overrides.get("kernel_oops", severity)
        event = Event(kind="kernel_oops", severity=severity, message=what, time=now, gpu=oops.gpu,
                      evidence={"line": oops.lines[0], "lines": oops.lines, "runbook": "oops",
                                "modules": sorted(oops.gpu_modules)})
        return [Burst(event, oops.last, oops.last, oops.arrived)]


def _attribute(record: KernelRecord, vendor: str) -> tuple[str | None, str | None]:
    """(gpu, other device): the GPU the line names, else a non-GPU PCI device it names (a PCIe port)."""
    text = record.text
    if m := _PREFIX.match(text):
        address = normalize_pci(m.group(2))
        return (address, None) if m.group(1) in GPU_DRIVERS else (None, address)
    if "NVRM" in text and (m := _NVRM_PCI.search(text)):
        return normalize_pci(m.group(1)), None
    if record.device:
        return (record.device, None) if vendor in ("amd", "nvidia") else (None, record.device)
    return None, None
