"""The kernel-line classifier: records in, events out. Pure: the caller passes the time.

- The first matching rule names the kind; Xid lines take severity and meaning from the Xid catalog, and an Xid
  "caused by previous Xid N" carries N and is at least as severe as N when the catalog knows N (an Xid 45
  cleanup after an NVLink Xid 149 is a warning, not info).
- Correlations (rules.CORRELATIONS) judge outcomes across lines of one GPU: a line can raise the severity of
  another, or a pair of lines stands for a new event (a reset whose own ring tests fail is a failed reset).
- A burst of lines with the same kind, severity, subject (and Xid) within `storm_window` seconds of the
  previous one (in log time) is one event whose count grows; a burst that lasts `max_burst` seconds starts
  a new event. `flush` closes bursts that saw no line for `storm_window` (in the caller's time).
- Oops reports span many lines: they are collected until they end, then judged by whether a GPU driver
  is in the trace.
- A fault names the process it belongs to (`evidence["process"]`, rules.PROCESS_FORMATS) in its own line, or, for
  a rule with `process_follows`, in the next line of the same report: such a line waits for the next record (at
  most PROCESS_WAIT seconds, in the caller's time, for a report cut between reads). A burst is one process's: a
  line naming another process starts a new event; a line that names none (a fault's status lines) joins the
  latest. An Xid names a process in every line, but only an application's Xid (xid.PROCESS_XIDS) is that
  process's fault; for the others it is kept as `context_process`.
- A benign line costs one Aho-Corasick scan for the rules' literal hints (derived from their expressions,
  kernel/hints.py); only lines that hold one are matched against the expressions. A rule whose expression
  yields no hints (a case-insensitive config rule) is tried on every line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import ahocorasick

from gpuwarden.kernel import xid as xid_catalog
from gpuwarden.kernel.hints import hints as literal_hints
from gpuwarden.kernel.records import KernelRecord
from gpuwarden.kernel.rules import (
    CORRELATIONS,
    DUMP_STACK_FRAME,
    FRAME,
    GHES_PCIE,
    GHES_RECORD,
    GHES_RULE,
    GHES_SEVERITIES,
    GHES_SEVERITY,
    GPU_DRIVERS,
    GPU_MODULES,
    GSP_FRAME,
    OOPS_END,
    OOPS_HEADERS,
    OOPS_HINTS,
    PROCESS_FORMATS,
    RULES,
    TRACE_LINE,
    Correlation,
    Rule,
)
from gpuwarden.model import Event, Severity, normalize_pci

_PREFIX = re.compile(r"^\s*([\w-]+) ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): ")
_NVRM_PCI = re.compile(r"(?:\(PCI:|GPU at PCI:|NVRM: GPU |NVIDIA GPU )"
                       r"([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)")
_FRAME = re.compile(FRAME)
_TRACE_LINE = re.compile(TRACE_LINE)
_DUMP_STACK = re.compile(DUMP_STACK_FRAME)
_GSP_FRAME = re.compile(GSP_FRAME)
_CAUSED_BY = re.compile(r"caused by previous Xid (\d+)")
_GHES = re.compile(GHES_RECORD)
_GHES_SEVERITY = re.compile(GHES_SEVERITY)
_GHES_PCIE = re.compile(GHES_PCIE)
_OOPS_HEADERS = [(re.compile(p), s) for p, s in OOPS_HEADERS]
_OOPS_END = re.compile(OOPS_END)
_OOPS_LINES = 120  # an oops report longer than this is cut and judged on what was seen
_PROCESS = [re.compile(f.pattern) for f in PROCESS_FORMATS]
PROCESS_WAIT = 0.5  # seconds a fault line waits for its report's process line when the reads split them


@dataclass
class Burst:
    """One event standing for a burst of lines; `row_id` is set by whoever stores the event."""

    event: Event
    first: float  # log time
    last: float  # log time
    arrived: float  # caller's time of the latest line
    count: int = 1
    row_id: int | None = None
    boot: str | None = None  # the boot its line was logged in, where the source says (a journal's catch-up)

    @property
    def final(self) -> Event:
        return replace(self.event, count=self.count)


class _Held(NamedTuple):
    """A fault line waiting for the process line that may follow it."""

    rule: Rule
    match: re.Match[str]
    record: KernelRecord
    stamp: float
    now: float


class Flushed(NamedTuple):
    new: list[Burst]  # events that only a closed report could make (oops)
    grown: list[Burst]  # closed bursts that counted more than one line: update their stored count


@dataclass
class _Oops:
    severity: Severity | None  # None: a call trace seen without its header
    lines: list[str] = field(default_factory=list)
    gpu_modules: set[str] = field(default_factory=set)
    gpu: str | None = None
    dumped: bool = False  # passes through dump_stack: a driver printed it on purpose
    gsp: bool = False  # the stack of NVRM's GSP RPC-timeout report
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
        self._gsp_rule = next((r for r in rules if r.name == "nv_gsp_timeout"), None)
        self._gate = ahocorasick.Automaton()
        for hint in {h for _, r in self._rules for h in r.hints} | set(OOPS_HINTS) | set(literal_hints(GHES_RECORD)):
            self._gate.add_word(hint, hint)
        self._gate.make_automaton()
        self._severity_overrides = severity_overrides or {}
        self._xid_overrides = xid_overrides or {}
        self.storm_window = storm_window
        self.max_burst = max_burst
        self._bursts: dict[tuple, Burst] = {}
        self._latest: dict[tuple, tuple] = {}  # (kind, severity, subject, xid) -> the key of its latest burst
        # rule -> recent lines: (gpu, log time, text, other device)
        self._recent: dict[str, list[tuple[str | None, float, str, str | None]]] = {}
        self._emitted: dict[tuple[str, str | None], float] = {}  # (correlation, gpu) -> log time
        self._ghes: dict[str, Severity] = {}  # GHES record id -> its event severity
        self._oops: _Oops | None = None
        self._held: _Held | None = None

    def feed(self, record: KernelRecord, now: float) -> list[Burst]:
        """Classify one record; returns the bursts that this record started (new events)."""
        text = record.text
        stamp = record.timestamp if record.timestamp is not None else now
        out: list[Burst] = []
        if held := self._held:
            self._held = None
            process = process_named(text) if _same_gpu(held.record, record) else None
            if process is not None and self._is_rule_line(text):
                process = None  # a fault of its own that names its process inline
            out += self._event(held.rule, held.match, held.record, held.stamp, held.now, process=process,
                               process_line=text if process is not None else None)
            if process is not None:  # the line was the fault's own process line
                return out
        if self._oops and stamp - self._oops.last > self.storm_window:
            out += self._close_oops(now)
        gated = next(self._gate.iter(text), None) is not None
        if not gated and not self._unhinted:
            return out
        if gated and (self._oops or _TRACE_LINE.match(text) or any(r.search(text) for r, _ in _OOPS_HEADERS)):
            oops_done = self._oops_line(text, record, stamp, now)
            if oops_done is not None:
                out += oops_done
                return out
        if gated and (ghes := _GHES.match(text)):
            return out + self._ghes_line(ghes.group("id"), text, record, stamp, now)
        for regex, rule in self._rules if gated else self._unhinted:
            m = regex.search(text)
            if m:
                if rule.process_follows and process_named(text) is None:
                    self._held = _Held(rule, m, record, stamp, now)
                else:
                    out += self._event(rule, m, record, stamp, now)
                break
        return out

    def _is_rule_line(self, text: str) -> bool:
        """A line of a fault of its own (one that names its process inline is not the process line of another)."""
        return any(regex.search(text) for regex, _ in self._rules)

    def flush(self, now: float, *, everything: bool = False) -> Flushed:
        """Close bursts and oops reports that ended (`everything`: all of them, at the end of a replay).

        `now` is on the clock of `feed`'s `now`.
        """
        grown = []
        for key, burst in list(self._bursts.items()):
            if everything or now - burst.arrived > self.storm_window:
                del self._bursts[key]
                if self._latest.get(key[:4]) == key:
                    del self._latest[key[:4]]
                if burst.count > 1:
                    grown.append(burst)
        new = []
        if (held := self._held) and (everything or now - held.now > PROCESS_WAIT):
            self._held = None
            new += self._event(held.rule, held.match, held.record, held.stamp, held.now)
        if self._oops and (everything or now - self._oops.arrived > self.storm_window):
            new += self._close_oops(now)
        return Flushed(new, grown)

    # --- one-line events -------------------------------------------------------------------------

    def _event(self, rule: Rule, m: re.Match[str], record: KernelRecord, stamp: float, now: float,
               severity: Severity | None = None, process: dict | None = None,
               process_line: str | None = None) -> list[Burst]:
        gpu, device = _attribute(record, rule.vendor)
        severity, meaning, xid = severity or rule.severity, rule.meaning, None
        evidence = {"line": record.text, "rule": rule.name, "runbook": rule.runbook, "vendor": rule.vendor}
        process = process or process_named(record.text)
        if rule.kind == "xid":
            xid = int(m.group("xid"))
            if cause := _CAUSED_BY.search(record.text):
                evidence["caused_by"] = int(cause.group(1))
            severity, meaning = xid_catalog.judge(xid, self._xid_overrides, evidence.get("caused_by"))
            if process and xid not in xid_catalog.PROCESS_XIDS:
                evidence["context_process"], process = process, None
        if process:
            evidence["process"] = process
        if process_line:  # the line that names the process is evidence too: the alert shows both
            evidence["lines"] = [record.text, process_line]
        if xid is not None:
            evidence["xid"] = xid
        if device:
            evidence["pci"] = device
        if record.timestamp is not None:
            evidence["log_time"] = record.timestamp
        severity, outcomes = self._correlate(rule.name, gpu, stamp, now, severity, evidence)
        if rule.quiet:
            return outcomes
        severity = self._severity_overrides.get(rule.kind, severity)
        bursts = [b for b in (self._burst(rule.kind, severity, gpu, device, xid, meaning, evidence, stamp, now),
                              *outcomes) if b]
        for burst in bursts:  # a held line is released by a later record, which may be of another boot
            burst.boot = burst.boot or record.boot
        return bursts

    def _burst(self, kind: str, severity: Severity, gpu: str | None, device: str | None, xid: int | None,
               meaning: str, evidence: dict, stamp: float, now: float) -> Burst | None:
        """A new event, or None when the line joins the open burst of the same kind, severity, subject and
        process (a line that names no process joins the latest of them)."""
        pid = (evidence.get("process") or {}).get("pid")
        key = (kind, severity, gpu or device, xid, pid)
        burst = self._bursts.get(key if pid is not None else self._latest.get(key[:4], key))
        if burst and stamp - burst.last <= self.storm_window and stamp - burst.first <= self.max_burst:
            burst.count += 1
            burst.last, burst.arrived = stamp, now
            return None
        subject = f" on {gpu}" if gpu else (f" at {device}" if device else "")
        event = Event(kind=kind, severity=severity, message=f"{meaning}{subject}", time=now, gpu=gpu,
                      evidence=evidence)
        burst = self._bursts[key] = Burst(event, stamp, stamp, now)
        self._latest[key[:4]] = key
        return burst

    def _correlate(self, name: str, gpu: str | None, stamp: float, now: float, severity: Severity,
                   evidence: dict) -> tuple[Severity, list[Burst]]:
        """This line's severity after the correlations it completes, and the outcome events they make."""
        outcomes: list[Burst] = []
        for corr in CORRELATIONS:
            partners = corr.after if name in corr.then else corr.then if corr.either_order and name in corr.after \
                else ()
            hit = next((h for p in partners for h in reversed(self._recent.get(p, ()))
                        if abs(stamp - h[1]) <= corr.within_seconds and (h[0] is None or gpu is None or h[0] == gpu)
                        and not (corr.needs_gpu and h[0] is None and gpu is None)), None)
            if hit is None:
                continue
            if corr.emit is None:
                evidence["escalated"] = corr.why
                severity = max(severity, corr.severity)
            elif (burst := self._outcome(corr, hit[0] or gpu, stamp, now, [hit[2], evidence["line"]],
                                         evidence.get("pci") or hit[3])) is not None:
                outcomes.append(burst)
        hits = self._recent.setdefault(name, [])
        hits.append((gpu, stamp, evidence["line"], evidence.get("pci")))
        del hits[:-8]
        return severity, outcomes

    def _outcome(self, corr: Correlation, gpu: str | None, stamp: float, now: float, lines: list[str],
                 device: str | None) -> Burst | None:
        last = self._emitted.get((corr.name, gpu))
        if last is not None and 0 <= stamp - last <= corr.within_seconds:
            return None
        self._emitted[(corr.name, gpu)] = stamp
        evidence = {"line": lines[-1], "lines": lines, "rule": corr.name, "runbook": corr.runbook,
                    "why": corr.why, "log_time": stamp}
        if device:
            evidence["pci"] = device
        subject = f" on {gpu}" if gpu else ""
        event = Event(kind=corr.emit or "", severity=corr.severity, message=f"{corr.why}{subject}", time=now,
                      gpu=gpu, evidence=evidence)
        return Burst(event, stamp, stamp, now)

    def _ghes_line(self, record_id: str, text: str, record: KernelRecord, stamp: float, now: float) -> list[Burst]:
        """APEI/GHES records span lines tied by their `{N}` id: the severity line, then the section type."""
        if m := _GHES_SEVERITY.search(text):
            self._ghes[record_id] = GHES_SEVERITIES[m.group("severity")]
            return []
        if (m := _GHES_PCIE.search(text)) and record_id in self._ghes:
            return self._event(GHES_RULE, m, record, stamp, now, severity=self._ghes[record_id])
        return []

    # --- oops reports ----------------------------------------------------------------------------

    def _oops_line(self, text: str, record: KernelRecord, stamp: float, now: float) -> list[Burst] | None:
        """Feed a line to the open oops report; None when the line is not part of one."""
        header = next((sev for regex, sev in _OOPS_HEADERS if regex.search(text)), None)
        frames = _FRAME.findall(text)
        if self._oops is None:
            if header is None and not _TRACE_LINE.match(text):
                return None
            self._oops = _Oops(severity=header)
        oops = self._oops
        if header is not None:
            oops.severity = max(oops.severity or header, header)
        oops.lines.append(text)
        oops.gpu_modules.update(m for m in frames if m in GPU_MODULES)
        oops.dumped = oops.dumped or bool(_DUMP_STACK.search(text))
        oops.gsp = oops.gsp or bool(_GSP_FRAME.search(text))
        oops.gpu = oops.gpu or _attribute(record, "kernel")[0]
        oops.last, oops.arrived = stamp, now
        if _OOPS_END.search(text) or len(oops.lines) >= _OOPS_LINES:
            return self._close_oops(now)
        return []

    def _close_oops(self, now: float) -> list[Burst]:
        oops, self._oops = self._oops, None
        if oops is None:
            return []
        if oops.severity is None and oops.dumped:  # a stack a driver printed on purpose, not a crash
            return self._gsp_stack(oops, now) if oops.gsp and self._gsp_rule else []
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


    def _gsp_stack(self, oops: _Oops, now: float) -> list[Burst]:
        """NVRM dumps the stack of _kgspRpcRecvPoll when a GSP RPC times out: part of the GSP timeout report."""
        rule = self._gsp_rule
        evidence = {"line": oops.lines[0], "lines": oops.lines, "rule": rule.name, "runbook": rule.runbook,
                    "vendor": rule.vendor, "log_time": oops.last}
        burst = self._burst(rule.kind, rule.severity, oops.gpu, None, None, rule.meaning, evidence, oops.last, now)
        return [burst] if burst else []


def process_named(text: str) -> dict | None:
    """The process a driver's line names: {"pid", "name"} (pid 0: the driver knew none), or None."""
    if "pid" not in text:  # every format has it: most fault lines are done here
        return None
    for regex in _PROCESS:
        if m := regex.search(text):
            return {"pid": int(m.group("pid") or 0), "name": m.group("name")}
    return None


def _same_gpu(first: KernelRecord, then: KernelRecord) -> bool:
    """Two lines may be of one report: they name the same GPU, or one of them names none."""
    a, b = _attribute(first, "amd")[0], _attribute(then, "amd")[0]
    return a is None or b is None or a == b


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
