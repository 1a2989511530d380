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
- A storm's lines repeat a few texts: what a text alone decides (its rule and match, its process, its GPU) is kept
  per text (bounded), and a line that joins an open burst costs its count: its evidence is made only for an event
  it starts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import ahocorasick

from gpuwarden.core.model import Event, Severity, normalize_pci
from gpuwarden.kernel import xid as xid_catalog
from gpuwarden.kernel.hints import hints as literal_hints
from gpuwarden.kernel.records import KernelRecord
from gpuwarden.kernel.rules import (
    BDF,
    BOOT_RESETS,
    COMM_LEN,
    CORRELATIONS,
    DRIVER_START,
    DRM_CORE_MODULES,
    DRM_CORE_WARNING,
    DUMP_STACK_FRAME,
    GHES_PCIE,
    GHES_RECORD,
    GHES_RULE,
    GHES_SEVERITIES,
    GHES_SEVERITY,
    GPU_DRIVERS,
    GPU_MODULES,
    GPU_VENDORS,
    GSP_FRAME,
    HUNG_AFTER_GPU_FAULT,
    HUNG_TASK,
    MODULE_FRAME,
    MODULES_LINE,
    NAME_ESCAPE,
    OOPS_END,
    OOPS_HEADERS,
    OOPS_HINTS,
    PROCESS_FORMATS,
    RESET_AFTER_FAULT,
    RULES,
    TRACE_LINE,
    USER_TEXT_AFTER_NAME,
    USER_TEXT_SPAN,
    USER_TEXT_START,
    USER_TEXT_TAIL,
    Correlation,
    Rule,
    anchored,
    config_anchored,
)

_PREFIX = re.compile(rf"^\s*([\w-]+) ({BDF}): ")
_NVRM_PCI = re.compile(r"(?:\(PCI:|GPU at PCI:|NVRM: GPU |NVIDIA GPU )"
                       r"([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)")
_ANY_PCI = re.compile(rf"(?<![\w:]){BDF}(?![\w:])")
_DRIVER_START = re.compile(DRIVER_START)
_AFTER_NAME = re.compile(USER_TEXT_AFTER_NAME).search
_TEXT_START = re.compile(USER_TEXT_START).match
_TEXT_TAIL = re.compile(USER_TEXT_TAIL).match
_NAME_ESCAPE = re.compile(NAME_ESCAPE)
# The first characters of a line that may matter at all: a superset of a driver's prefix (DRIVER_START), an oops
# report's header (OOPS_HEADERS), a GHES record and a report's end, cheap to refuse (possessive: no backtracking).
# The literal starts come first and a header after a first word is its own branch: a benign line is refused sooner.
_HEADER_START = r"BUG|kernel BUG|Oops|Kernel panic|general protection|invalid op|Unable to handle"
_START = re.compile(
    r"[ \t]*+(?:amdgpu|amdkfd|radeon|drmn|NVRM|nvidia|kfd |pcieport|AMD-Vi|\[drm|\{|-|CPU |WARNING|INFO: task|"
    rf"(?P<modules>{MODULES_LINE})|"
    rf"{_HEADER_START}|[\w-]++ [0-9a-fA-F]{{4,8}}:|\S++ (?:{_HEADER_START}))")
_MODULE_FRAME = re.compile(MODULE_FRAME)
_DUMP_STACK = re.compile(DUMP_STACK_FRAME)
_GSP_FRAME = re.compile(GSP_FRAME)
# amdgpu's gmc_v9 "(src_id:%u ring:%u vmid:%u pasid:%u, ...)", gmc_v8 "(0x%02x, vmid %d, pasid %d)"
_PASID = re.compile(r"\bpasid[: ](\d{1,10})\b")
_CAUSED_BY = re.compile(r"caused by previous Xid (\d+)")
_GHES = re.compile(GHES_RECORD)
_GHES_SEVERITY = re.compile(GHES_SEVERITY)
_GHES_PCIE = re.compile(GHES_PCIE)
# one match for every header and a stack frame: group h<i> names the header (tried first), `frame` a frame
_REPORT_LINE = re.compile("|".join([*(f"(?P<h{i}>{p})" for i, (p, _) in enumerate(OOPS_HEADERS)),
                                    f"(?P<frame>{TRACE_LINE})"]))  # all at ^: match
_HEADER_SEVERITY = {f"h{i}": s for i, (_, s) in enumerate(OOPS_HEADERS)}
_OOPS_END = re.compile(OOPS_END)
_END_MARK = os.path.commonprefix(literal_hints(OOPS_END))  # noqa: RUF071 (by character: "---[ end ", in every end line)
# A stack frame that cannot be a report's header too (the header wins), in one match: the bulk of an open report's
# lines. A header may start with a word that ends in a colon (`watchdog: BUG: soft lockup`); a frame's first word
# ends in one only in a line such as `f+0x1/0x2: BUG: x`, and no other header can start a frame line (OOPS_HEADERS,
# TRACE_LINE): a frame whose first space follows a colon takes the long way. The frame is the whole line (its module
# after it at most): a line with more after a frame-like start, such as a task named `a+0x0/0x0 [xe]` that
# segfaulted (`…[xe][42]: segfault at`), takes the long way too, where its user's fields are seen (user_text).
_FRAME_ONLY = re.compile(rf"(?![^ ]*: )(?:{TRACE_LINE})(?: \[\w+(?: [0-9a-f]+)?\])?\s*$")
_HUNG_TASK = re.compile(HUNG_TASK)
_DRM_CORE_WARNING = re.compile(DRM_CORE_WARNING)
_OOPS_LINES = 120  # an oops report longer than this is cut and judged on what was seen
_PROCESS = [re.compile(f.pattern) for f in PROCESS_FORMATS]
# Seconds a fault line waits for its report's process line when it is not in the same read: the driver prints
# both in one function, microseconds apart, so a report cut between reads completes within a few milliseconds.
PROCESS_WAIT = 0.002
# the rules some correlation names: only their lines are kept for it (Classifier._recent) and checked against it
_CORRELATED = frozenset(name for corr in CORRELATIONS for name in (*corr.after, *corr.then))
# rule -> the rules of the lines its line may complete a correlation with (Classifier._correlations, all of them)
_PARTNERS = {name: tuple({p for corr in CORRELATIONS if name in corr.then or (corr.either_order and name in corr.after)
                          for p in (corr.after if name in corr.then else corr.then)}) for name in _CORRELATED}
_TEXT_LOG = "a text log does not say who wrote the line"  # unverified() of a record without metadata


@dataclass(eq=False, repr=False)
class Burst:
    """One event standing for a burst of lines; `ref` is what the sink called the event when
    it was reported (its final count is reported by it)."""

    event: Event
    first: float  # log time
    last: float  # log time
    arrived: float  # caller's time of the latest line
    count: int = 1
    ref: tuple[str, int] | None = None
    boot: str | None = None  # the boot its line was logged in, where the source says (a journal's catch-up)
    wall: float | None = None  # when its line was logged on the wall clock, where the source says (the journal)

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


@dataclass(slots=True, eq=False, repr=False)
class _Oops:
    """An oops or call trace being read, line by line, until it ends."""

    severity: Severity | None  # None: a call trace seen without its header
    first: float  # log time
    lines: list[str] = field(default_factory=list)
    modules: set[str] = field(default_factory=set)  # of its stack frames
    loaded: set[str] = field(default_factory=set)  # the GPU drivers its `Modules linked in:` line names
    hung: bool = False  # a hung task's report (kernel/hung_task.c)
    drm_core: bool = False  # a WARNING in a file of the DRM core
    gpu: str | None = None
    dumped: bool = False  # passes through dump_stack: a driver printed it on purpose
    gsp: bool = False  # the stack of NVRM's GSP RPC-timeout report
    last: float = 0.0  # log time
    arrived: float = 0.0  # caller's time
    verified: bool = True  # every line of it is the kernel's own (the carriers of user text are never part of one)
    boot: str | None = None  # the boot it was logged in, where the source says (its header's record)
    wall: float | None = None  # when it was logged, on the wall clock, where the source says


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
        # The built-in rules as one expression: the driver's prefix is read once, then every rule is tried where
        # the message starts; group r<i> names the rule (the first in order that matches there). A rule is compiled
        # on its own only where it is tried on its own: a config rule, or one whose expression yields no hints (each
        # compile of a rule's expression, the driver's prefix with it, is ~1 ms of every start).
        self._builtin = list(rules)
        self._combined = re.compile(anchored("|".join(f"(?P<r{i}>{r.pattern})" for i, r in enumerate(rules))))
        self._extra = [(re.compile(config_anchored(r.pattern)), r) for r in extra_rules]
        self._unhinted = [(regex, r) for regex, r in self._extra if not r.hints] + \
            [(re.compile(anchored(r.pattern)), r) for r in rules if not r.hints]
        self._fast = not extra_rules  # a config rule may match any line's start: then every line is looked at
        self._gsp_rule = next((r for r in rules if r.name == "nv_gsp_timeout"), None)
        self._gate = ahocorasick.Automaton()
        for hint in {h for r in (*extra_rules, *rules) for h in r.hints} | set(OOPS_HINTS) | \
                set(literal_hints(GHES_RECORD)):
            self._gate.add_word(hint, hint)
        self._gate.make_automaton()
        self._pregate = _pregate(self._gate.keys())
        self._severity_overrides = severity_overrides or {}
        self._xid_overrides = xid_overrides or {}
        self._xids: dict[tuple[int, int | None], tuple[Severity, str]] = {}  # (Xid, caused by) -> judged, once
        self.storm_window = storm_window
        self.max_burst = max_burst
        self.live_since: float | None = None  # lines stamped before it are history (the caller's: kernel/watch.py)
        self._bursts: dict[tuple, Burst] = {}
        # text -> (rule, match, held) of a fault line judged with no report open: a storm's lines repeat a few texts
        self._seen: dict[str, tuple[Rule, re.Match[str], bool]] = {}
        # bursts a line closed by starting the next under the same key (past max_burst or the storm window, in log
        # time, before flush's caller's clock closed them): reported by the next flush like the ones it closes
        self._superseded: list[Burst] = []
        self._latest: dict[tuple, tuple] = {}  # (kind, severity, subject, xid) -> the key of its latest burst
        # rule -> recent lines: (gpu, log time, text, other device, verified, capped, boot)
        self._recent: dict[str, list[tuple[str | None, float, str, str | None, bool, bool, str | None]]] = {}
        # (correlation, gpu) -> (log time, boot) of the last event it made
        self._emitted: dict[tuple[str, str | None], tuple[float, str | None]] = {}
        self._partners: dict[str, list[tuple[Correlation, tuple[str, ...]]]] = {}  # rule -> _correlations
        self._ghes: dict[str, Severity] = {}  # GHES record id -> its event severity
        self._oops: _Oops | None = None
        self._held: _Held | None = None
        # vendor -> (the GPU its latest report named, log time, boot)
        self._carry: dict[str, tuple[str, float, str | None]] = {}
        # the latest lines of the GPU drivers' rules that their record does not disprove (a kmsg or journal line is
        # the kernel's; a text log proves nothing either way): (gpu, log time, severity, vendor, boot), for the
        # context of a hung task and of a reset (_gpu_line_before)
        self._gpu_lines: list[tuple[str | None, float, Severity, str, str | None]] = []

    def feed(self, record: KernelRecord, now: float) -> list[Burst]:
        """Classify one record; returns the bursts that this record started (new events)."""
        started = self.feed_all((record,), now)
        return started[0][1] if started else []

    def feed_all(self, records: Iterable[KernelRecord], now: float) -> list[tuple[KernelRecord, list[Burst]]]:
        """Classify a batch of records in order: the records that started bursts, each with them. The common lines
        are refused in this loop, without a call each."""
        out = []
        fast, start, gate, frame, pregate = self._fast, _START.match, self._gate.iter, _FRAME_ONLY.match, \
            self._pregate.iter
        bursts, seen = self._bursts, self._seen
        for record in records:
            text = record.text
            gated = None  # whether the line holds a rule's or a report's literal (the Aho-Corasick gate), once known
            if self._held is None:
                if bursts and self._oops is None and (known := seen.get(text)) is not None:
                    # while a burst is open (a storm), a fault line seen before: its rule and match are known
                    rule, m, hold = known  # (_rule_line's work)
                    stamp = record.timestamp if record.timestamp is not None else now
                    if hold:
                        self._held = _Held(rule, m, record, stamp, now)
                    elif started := self._event(rule, m, record, stamp, now):
                        out.append((record, started))
                    continue
                if "+0x" not in text:
                    if fast and ((m := start(text)) is None or m.lastgroup is not None
                                 or next(pregate(text), None) is None or not (gated := next(gate(text), None))):
                        # The common case: a line that no driver and no oops report starts, or a driver's line
                        # without any rule's literal (within an open report such a line is not part of it either).
                        # An open report past its window is closed by the next line that is, or by flush().
                        if m is not None and m.lastgroup and (oops := self._oops) is not None:
                            oops.lines.append(text)  # its `Modules linked in:` line (long: not scanned by the gate)
                            oops.loaded.update(_loaded_gpu_drivers(text))
                        continue
                elif (oops := self._oops) is not None and frame(text):
                    # the next frame of an open report, the bulk of a report's lines: straight to it
                    stamp = record.timestamp if record.timestamp is not None else now
                    if not self._ends(oops, stamp, record.boot):
                        if started := self._report_line(oops, text, record, stamp, now, True):
                            out.append((record, started))
                        continue
            if started := self._classify(record, text, now, gated):
                out.append((record, started))
        return out

    def _classify(self, record: KernelRecord, text: str, now: float, gated: str | bool | None) -> list[Burst]:
        """One record past the common case (`gated`: the literal the gate found in it, None when not asked yet)."""
        stamp = record.timestamp if record.timestamp is not None else now
        out: list[Burst] = []
        if held := self._held:
            self._held = None
            process = _facts(text).process  # first: cached, and a storm's next fault line names none
            if process is not None and not (_DRIVER_START.match(text) and not user_text(text) and _same_gpu(
                    held.record, record) and _no_less_proven(held.record, record)):
                process = None
            if process is not None and self._is_rule_line(text):
                process = None  # a fault of its own that names its process inline
            out += self._event(held.rule, held.match, held.record, held.stamp, held.now, process=process,
                               process_line=text if process is not None else None)
            if process is not None:  # the line was the fault's own process line
                return out
        if self._oops and self._ends(self._oops, stamp, record.boot):
            out += self._close_oops(now)
        if self._oops is None and (known := self._seen.get(text)) is not None:
            return out + self._rule_line(known, record, stamp, now)
        if self._oops is not None and "+0x" in text and (m := _REPORT_LINE.match(text)) \
                and m.lastgroup == "frame" and not user_text(text):
            return out + self._report_line(self._oops, text, record, stamp, now, True)  # a report's next frame
        if gated is None:
            gated = next(self._gate.iter(text), None) is not None
        if not gated and not self._unhinted:
            return out
        # a line with a user's fields (a task's name) is never part of a fault (asked only of a line that could be)
        if gated and (self._oops or _REPORT_LINE.match(text)) \
                and not user_text(text) \
                and not (self._oops and self._is_rule_line(text)):  # a fault printed meanwhile is its own
            oops_done = self._oops_line(text, record, stamp, now)
            if oops_done is not None:
                out += oops_done
                return out
        if gated and (ghes := _GHES.match(text)):
            return out + self._ghes_line(ghes.group("id"), text, record, stamp, now)
        rule, m = self._match(text, gated)
        if m and not user_text(text):  # a driver's prefix in a task's name is no driver's line
            known = (rule, m, rule.process_follows and _facts(text).process is None)
            if self._oops is None:  # what the text alone decided: the same text decides the same (_seen)
                if len(self._seen) >= _SEEN_MAX:
                    self._seen.clear()
                self._seen[text] = known
            out += self._rule_line(known, record, stamp, now)
        return out

    def _rule_line(self, known: tuple[Rule, re.Match[str], bool], record: KernelRecord, stamp: float,
                   now: float) -> list[Burst]:
        """A line of a rule (`known`: the rule, its match, whether the line waits for its process line)."""
        rule, m, hold = known
        if hold:
            self._held = _Held(rule, m, record, stamp, now)
            return []
        return self._event(rule, m, record, stamp, now)

    def _match(self, text: str, gated: bool) -> tuple[Rule | None, re.Match[str] | None]:
        """The first rule that matches the line (config rules first), and its match."""
        for regex, rule in self._extra if gated else self._unhinted:
            if m := regex.match(text):
                return rule, m
        if gated and (m := self._combined.match(text)):
            return self._builtin[int(m.lastgroup[1:])], m
        return None, None

    def deadline(self) -> float | None:
        """When (on `feed`'s clock) a held line must be released if no record comes: the caller wakes up then."""
        return self._held.now + PROCESS_WAIT if self._held else None

    def _is_rule_line(self, text: str) -> bool:
        """A line of a fault of its own (one that names its process inline is not the process line of another)."""
        return self._match(text, True)[1] is not None

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
        if (held := self._held) and (everything or now - held.now >= PROCESS_WAIT):
            self._held = None
            new += self._event(held.rule, held.match, held.record, held.stamp, held.now)
        if self._oops and (everything or now - self._oops.arrived > self.storm_window):
            new += self._close_oops(now)
        grown += (b for b in self._superseded if b.count > 1)  # last: releasing a held line may close one too
        self._superseded = []
        return Flushed(new, grown)

    # --- one-line events -------------------------------------------------------------------------

    def _event(self, rule: Rule, m: re.Match[str], record: KernelRecord, stamp: float, now: float,
               severity: Severity | None = None, process: dict | None = None,
               process_line: str | None = None) -> list[Burst]:
        # A storm's every line comes here: the helpers' work is inlined where it is common (a text seen before,
        # a text log, no partner line of a correlation).
        text, vendor, name = record.text, rule.vendor, rule.name
        facts = _FACTS.get(text) or _facts(text)
        if (named := facts.prefix) is None and facts.nvrm is not None:
            named = (facts.nvrm, None)
        if named is None:
            gpu, device = self._attribute(record, vendor, stamp)
        else:  # _attribute's answer for a line that names its device
            gpu, device = named
            if gpu is not None and vendor in GPU_VENDORS:
                self._carry[vendor] = (gpu, stamp, record.boot)
        severity, meaning, xid, context_process = severity or rule.severity, rule.meaning, None, None
        if name in BOOT_RESETS and self._gpu_line_before(gpu, stamp, record.boot, RESET_AFTER_FAULT, "amd") is None:
            severity = Severity.INFO
            meaning = "a full GPU reset with no fault before it: the driver resetting the GPU as it starts it"
        why_not = unverified(record, _device_group(m)) if record.metadata else _TEXT_LOG
        if vendor in GPU_VENDORS and not (why_not and record.metadata):  # context only from proven lines
            self._gpu_lines.append((gpu, stamp, severity, vendor, record.boot))
            if len(self._gpu_lines) > 16:  # the latest 16 (one line at a time comes in)
                del self._gpu_lines[0]
        process = process or facts.process
        if rule.kind == "xid":
            xid = int(m.group("xid"))
            if (judged := self._xids.get((xid, facts.caused_by))) is None:
                judged = self._xids[(xid, facts.caused_by)] = xid_catalog.judge(xid, self._xid_overrides,
                                                                                 facts.caused_by)
            severity, meaning = judged
            if process and xid not in xid_catalog.PROCESS_XIDS:
                context_process, process = process, None
        # the kernel's own record could have proven the line and did not: evidence, at most a warning
        capped = bool(why_not and record.metadata)
        outcomes, escalated = [], None
        if name in _CORRELATED:  # (in no correlation: no line of it is ever asked for)
            recent = self._recent
            for partner in _PARTNERS[name]:
                if recent.get(partner):
                    severity, outcomes, escalated = self._correlate(name, gpu, stamp, now, severity, text, device,
                                                                    why_not is None, capped, record.boot)
                    break
            else:  # no partner line: only this line is kept for those that may come (_correlate's last step)
                hits = recent.setdefault(name, [])
                hits.append((gpu, stamp, text, device or None, why_not is None, capped, record.boot))
                if len(hits) > 8:
                    del hits[0]
        made = (rule, record, why_not, facts, xid, context_process, process, process_line, device, escalated)
        if xid in xid_catalog.IMPLIES:
            outcomes += self._implied(rule, xid, gpu, device, _evidence(*made), capped, stamp, now, record.boot)
        if rule.quiet:
            return _logged(outcomes, record)
        severity = self._severity_overrides.get(rule.kind, severity)
        if capped:
            severity = min(severity, Severity.WARNING)
            meaning = f"{meaning} (unverified: {why_not})"
        pid = process["pid"] if process else None
        key = (rule.kind, severity, gpu or device, xid, pid)
        if self._joins(key, stamp, now, record.boot):  # it joins its open burst: its count, no evidence made
            bursts = outcomes
        else:
            bursts = [self._start(key, gpu, device, meaning, _evidence(*made), stamp, now), *outcomes]
        return _logged(bursts, record)

    def _burst(self, kind: str, severity: Severity, gpu: str | None, device: str | None, xid: int | None,
               meaning: str, evidence: dict, stamp: float, now: float, boot: str | None) -> Burst | None:
        """A new event, or None when the line joins the open burst of the same kind, severity, subject and
        process (a line that names no process joins the latest of them)."""
        key = (kind, severity, gpu or device, xid, (evidence.get("process") or {}).get("pid"))
        if self._joins(key, stamp, now, boot):
            return None
        burst = self._start(key, gpu, device, meaning, evidence, stamp, now)
        burst.boot = boot
        return burst

    def _joins(self, key: tuple, stamp: float, now: float, boot: str | None) -> bool:
        """Whether a line of `key` (kind, severity, subject, Xid, pid) joins its open burst: then it is counted."""
        burst = self._bursts.get(key if key[4] is not None else self._latest.get(key[:4], key))
        if burst and stamp - burst.last <= self.storm_window and stamp - burst.first <= self.max_burst \
                and not self._apart(burst.first, burst.boot, stamp, boot):
            burst.count += 1
            burst.last, burst.arrived = stamp, now
            return True
        return False

    def _apart(self, first: float, first_boot: str | None, stamp: float, boot: str | None) -> bool:
        """Whether a line (`stamp`, `boot`) cannot count with an earlier one (`first`, `first_boot`) as one event:
        of another boot, or live where that one is history (whose event is never acted on: a storm that goes on
        across the start would not be, for a minute)."""
        return not _same_boot(first_boot, boot) or (self.live_since is not None and first < self.live_since <= stamp)

    def _ends(self, oops: _Oops, stamp: float, boot: str | None) -> bool:
        """Whether a line ends the open report rather than goes on with it: of another boot (a journal's catch-up
        across a crash reboot often ends the earlier boot's report with no end line), or more than the storm window
        from its last line, either way (two boots' stamps do not compare)."""
        return not _same_boot(oops.boot, boot) or abs(stamp - oops.last) > self.storm_window

    def _start(self, key: tuple, gpu: str | None, device: str | None, meaning: str, evidence: dict, stamp: float,
               now: float) -> Burst:
        subject = f" on {gpu}" if gpu else (f" at {device}" if device else "")
        event = Event(kind=key[0], severity=key[1], message=f"{meaning}{subject}", time=now, gpu=gpu,
                      evidence=evidence)
        if (closed := self._bursts.get(key)) is not None:
            self._superseded.append(closed)  # its count is final: the store must still hear of it
        burst = self._bursts[key] = Burst(event, stamp, stamp, now)
        self._latest[key[:4]] = key
        return burst

    def _correlate(self, name: str, gpu: str | None, stamp: float, now: float, severity: Severity, line: str,
                   device: str | None, verified: bool, capped: bool, boot: str | None
                   ) -> tuple[Severity, list[Burst], str | None]:
        """This line's severity after the correlations it completes, the outcome events they make, and why it was
        raised (None: it was not)."""
        outcomes: list[Burst] = []
        escalated = None
        recent = self._recent
        for corr, partners in self._correlations(name):
            hit = None
            for p in partners:  # loops, not a generator: in a storm the partners mostly have no line
                for h in reversed(recent.get(p, ())):
                    if abs(stamp - h[1]) <= corr.within_seconds and (h[0] is None or gpu is None or h[0] == gpu) \
                            and not (corr.needs_gpu and h[0] is None and gpu is None) and _same_boot(h[6], boot):
                        hit = h
                        break
                if hit is not None:
                    break
            if hit is None:
                continue
            if corr.emit is None:
                escalated = corr.why
                severity = max(severity, corr.severity)
            elif (burst := self._outcome(corr, hit[0] or gpu, stamp, now, [hit[2], line], device or hit[3],
                                         hit[4] and verified, hit[5] or capped, boot)) is not None:
                outcomes.append(burst)
        hits = recent.setdefault(name, [])
        hits.append((gpu, stamp, line, device or None, verified, capped, boot))
        if len(hits) > 8:  # the latest 8 (one line at a time comes in)
            del hits[0]
        return severity, outcomes, escalated

    def _correlations(self, name: str) -> list[tuple[Correlation, tuple[str, ...]]]:
        """The correlations a line of rule `name` can complete, each with the rules of its partner lines (worked
        out once per rule: most rules are in none, and a storm's every line asks)."""
        if (found := self._partners.get(name)) is None:
            found = self._partners[name] = [
                (corr, corr.after if name in corr.then else corr.then) for corr in CORRELATIONS
                if name in corr.then or (corr.either_order and name in corr.after)]
        return found

    def _outcome(self, corr: Correlation, gpu: str | None, stamp: float, now: float, lines: list[str],
                 device: str | None, verified: bool, capped: bool, boot: str | None) -> Burst | None:
        last = self._emitted.get((corr.name, gpu))
        if last is not None and abs(stamp - last[0]) <= corr.within_seconds and not self._apart(*last, stamp, boot):
            return None
        self._emitted[(corr.name, gpu)] = (stamp, boot)
        evidence = {"line": lines[-1], "lines": lines, "rule": corr.name, "runbook": corr.runbook,
                    "why": corr.why, "log_time": stamp, "verified": verified}
        if device:
            evidence["pci"] = device
        subject = f" on {gpu}" if gpu else ""
        severity = min(corr.severity, Severity.WARNING) if capped else corr.severity
        event = Event(kind=corr.emit or "", severity=severity, message=f"{corr.why}{subject}", time=now,
                      gpu=gpu, evidence=evidence)
        return Burst(event, stamp, stamp, now)

    def _implied(self, rule: Rule, xid: int, gpu: str | None, device: str | None, evidence: dict, capped: bool,
                 stamp: float, now: float, boot: str | None) -> list[Burst]:
        """An event one line stands for besides its own: an Xid whose catalog entry implies another kind (Xid 79:
        the GPU fell off the bus), once per GPU within the storm window."""
        kind, severity, why = xid_catalog.IMPLIES[xid]
        if evidence.get("unverified") and capped:
            severity = min(severity, Severity.WARNING)
        key = (f"implied_{kind}", gpu)
        last = self._emitted.get(key)
        if last is not None and abs(stamp - last[0]) <= self.max_burst and not self._apart(*last, stamp, boot):
            return []
        self._emitted[key] = (stamp, boot)
        implied_evidence = {k: v for k, v in evidence.items() if k not in ("xid", "caused_by")}
        implied_evidence.update(rule=f"{rule.name}_{xid}", why=why, runbook=kind)
        subject = f" on {gpu}" if gpu else (f" at {device}" if device else "")
        event = Event(kind=kind, severity=severity, message=f"{why}{subject}", time=now, gpu=gpu,
                      evidence=implied_evidence)
        return [Burst(event, stamp, stamp, now)]

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
        kind = m.lastgroup if (m := _REPORT_LINE.match(text)) else None
        header = _HEADER_SEVERITY.get(kind)
        if self._oops is None:
            if kind is None:
                return None
            self._oops = _Oops(severity=header, first=stamp, boot=record.boot, wall=record.wall)
        oops = self._oops
        if header is not None:
            oops.severity = max(oops.severity or header, header)
            oops.hung = oops.hung or _HUNG_TASK.match(text) is not None
            oops.drm_core = oops.drm_core or _DRM_CORE_WARNING.match(text) is not None
        if oops.gpu is None and kind != "frame":  # a frame names no device
            oops.gpu = self._attribute(record, "kernel", stamp)[0]
        return self._report_line(oops, text, record, stamp, now, kind == "frame")

    def _report_line(self, oops: _Oops, text: str, record: KernelRecord, stamp: float, now: float,
                     frame: bool) -> list[Burst]:
        """Add a line to the open report `oops` (`frame`: a stack frame); a report closes at its end line or its
        length limit."""
        oops.lines.append(text)
        # a module is read from a stack frame only: a report's header carries a task's name (`BUG: soft lockup -
        # CPU#%d stuck for %us! [%s:%d]`)
        if frame:
            if " [" in text:
                oops.modules.update(_MODULE_FRAME.findall(text))
        elif text.startswith(MODULES_LINE):
            oops.loaded.update(_loaded_gpu_drivers(text))
        if not oops.dumped and "dump_stack" in text:
            oops.dumped = _DUMP_STACK.search(text) is not None
        if not oops.gsp and "kgsp" in text:
            oops.gsp = _GSP_FRAME.search(text) is not None
        if oops.verified and unverified(record, None) is not None:
            oops.verified = False
        oops.last, oops.arrived = stamp, now
        if len(oops.lines) >= _OOPS_LINES or (_END_MARK in text and _OOPS_END.search(text)):
            return self._close_oops(now)
        return []

    def _close_oops(self, now: float) -> list[Burst]:
        oops, self._oops = self._oops, None
        if oops is None:
            return []
        if oops.severity is None and oops.dumped:  # a stack a driver printed on purpose, not a crash
            return self._gsp_stack(oops, now) if oops.gsp and self._gsp_rule else []
        gpu, modules, after = oops.gpu, sorted(oops.modules & GPU_MODULES), None
        if modules:
            severity = oops.severity if oops.severity is not None else Severity.WARNING
            what = f"kernel oops in {', '.join(modules)}"
        elif oops.loaded and (oops.drm_core or oops.modules & DRM_CORE_MODULES):
            severity = oops.severity if oops.severity is not None else Severity.WARNING
            what = f"kernel oops in the DRM core, with {', '.join(sorted(oops.loaded))} loaded"
        elif oops.hung and (after := self._gpu_line_before(None, oops.first, oops.boot,
                                                           HUNG_AFTER_GPU_FAULT)) is not None:
            severity = Severity.WARNING
            what = (f"a task hung {oops.first - after[1]:.0f} s after a GPU driver's fault line (no GPU frame in "
                    f"its trace)")
            gpu = gpu or after[0]
        elif oops.severity == Severity.CRITICAL:
            severity, what = Severity.WARNING, "kernel oops outside the GPU drivers"
        else:
            return []  # a warning or a stack dump that no GPU driver is part of: not ours
        severity = self._severity_overrides.get("kernel_oops", severity)
        evidence = {"line": oops.lines[0], "lines": oops.lines, "runbook": "oops", "modules": modules,
                    "verified": oops.verified}
        if after is not None:
            evidence["after_gpu_line"] = after[1]
        event = Event(kind="kernel_oops", severity=severity, message=what, time=now, gpu=gpu, evidence=evidence)
        return [Burst(event, oops.last, oops.last, oops.arrived, boot=oops.boot, wall=oops.wall)]


    def _attribute(self, record: KernelRecord, vendor: str, stamp: float) -> tuple[str | None, str | None]:
        """The GPU (or other device) the line names; a line of a GPU driver that names none belongs to the GPU
        the same driver's report named within the storm window (`NVRM: GPU4 RPC history` after the Xid line
        that gave GPU4's address; the status lines of a page fault)."""
        gpu, device = _named(record, vendor)
        if gpu is not None:
            if vendor in GPU_VENDORS:
                self._carry[vendor] = (gpu, stamp, record.boot)
        elif device is None and (carried := self._carry.get(vendor)) and 0 <= stamp - carried[1] <= self.storm_window \
                and _same_boot(carried[2], record.boot):
            gpu = carried[0]
        return gpu, device

    def _gpu_line_before(self, gpu: str | None, stamp: float, boot: str | None, within: float,
                         fault_of: str | None = None) -> tuple[str | None, float, Severity, str, str | None] | None:
        """The latest GPU driver's line of `gpu` (or naming none; any GPU for None) within `within` seconds before
        `stamp`, of the same boot; with `fault_of` (a vendor), only that vendor's lines at warning or above."""
        for line in reversed(self._gpu_lines):
            if 0 <= stamp - line[1] <= within and (gpu is None or line[0] is None or line[0] == gpu) \
                    and (fault_of is None or (line[3] == fault_of and line[2] >= Severity.WARNING)) \
                    and _same_boot(line[4], boot):
                return line
        return None

    def _gsp_stack(self, oops: _Oops, now: float) -> list[Burst]:
        """NVRM dumps the stack of _kgspRpcRecvPoll when a GSP RPC times out: part of the GSP timeout report."""
        rule = self._gsp_rule
        evidence = {"line": oops.lines[0], "lines": oops.lines, "rule": rule.name, "runbook": rule.runbook,
                    "vendor": rule.vendor, "log_time": oops.last, "verified": oops.verified}
        burst = self._burst(rule.kind, rule.severity, oops.gpu, None, None, rule.meaning, evidence, oops.last, now,
                            oops.boot)
        if burst is None:
            return []
        burst.wall = oops.wall
        return [burst]


def _logged(bursts: list[Burst], record: KernelRecord) -> list[Burst]:
    """`bursts`, each with the boot and wall time of its line (`record`), where the source says and it has none."""
    for burst in bursts:  # (a held line is released by a later record, which may be of another boot)
        burst.boot, burst.wall = burst.boot or record.boot, burst.wall or record.wall
    return bursts


def _same_boot(first: str | None, then: str | None) -> bool:
    """Whether two lines' stamps compare: the same boot, or a source that does not say (a text log)."""
    return first is None or then is None or first == then


def _evidence(rule: Rule, record: KernelRecord, why_not: str | None, facts: _Facts, xid: int | None,
              context_process: dict | None, process: dict | None, process_line: str | None, device: str | None,
              escalated: str | None) -> dict:
    """A rule line's evidence, made only for an event it starts (a line that joins a burst is its count)."""
    made = {"line": record.text, "rule": rule.name, "runbook": rule.runbook, "vendor": rule.vendor,
            "verified": why_not is None}
    if why_not:
        made["unverified"] = why_not
    if xid is not None and facts.caused_by is not None:
        made["caused_by"] = facts.caused_by
    if context_process:
        made["context_process"] = dict(context_process)
    if process:
        made["process"] = dict(process)
    if process_line:  # the line that names the process is evidence too: the alert shows both
        made["lines"] = [record.text, process_line]
    if facts.pasid is not None:  # the faulting address space (AMD): the policy resolves it
        made["pasid"] = facts.pasid
    if xid is not None:
        made["xid"] = xid
    if device:
        made["pci"] = device
    if record.timestamp is not None:
        made["log_time"] = record.timestamp
    if escalated is not None:
        made["escalated"] = escalated
    return made


def _pregate(words: Iterable[str]) -> ahocorasick.Automaton:
    """An automaton that finds a piece of each of `words`, faster than one of the words themselves: a line where it
    finds nothing holds none of them (the gate's verdict, for most driver lines, at about 60 % of its cost). An
    automaton's time per character grows with the number of characters its words start with (one that starts
    none is looked up among them all): each word is cut to its part from its first space when 5 characters or more
    remain (rare enough a literal), and the few words without one stay whole."""
    automaton = ahocorasick.Automaton()
    for word in words:
        cut = next((i for i, c in enumerate(word) if c == " " and len(word) - i >= 5), 0)
        automaton.add_word(word[cut:], word[cut:])
    automaton.make_automaton()
    return automaton


def _loaded_gpu_drivers(modules_line: str) -> list[str]:
    """The GPU drivers a report's `Modules linked in: name(OE+) …` names (each with its taint flags)."""
    return [m for m in (w.partition("(")[0] for w in modules_line[len(MODULES_LINE):].split()) if m in GPU_MODULES]


def user_text(text: str) -> bool:
    """Whether the kernel printed this line with a user's fields in it (rules.USER_TEXT_*): a task's name before
    fixed words, a line that starts with the kernel's words and then takes a user's text, or one that ends with the
    mapping a fault's ip is in (a file name broken by a newline still ends so). Read by the fixed words, never by the
    name, which may hold anything (15 bytes: a newline, a stack frame)."""
    if (m := _AFTER_NAME(text, 0, USER_TEXT_SPAN)) is not None \
            and len(_NAME_ESCAPE.sub(".", text[:m.start()].lstrip(" \t"))) <= COMM_LEN:
        return True
    if _TEXT_START(text) is not None:
        return True
    last = text.rfind("[")  # a frame's `[module]` holds no `+`: most lines stop here
    return last >= 0 and "+" in text[last:] and _TEXT_TAIL(text, last) is not None


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
    a, b = _named(first, "amd")[0], _named(then, "amd")[0]
    return a is None or b is None or a == b


def _no_less_proven(fault: KernelRecord, then: KernelRecord) -> bool:
    """A process line proven no less than its fault line: a line user space wrote to /dev/kmsg right after a
    driver's fault must not pin that fault on a process of its choosing."""
    return _unproven(fault) is not None or _unproven(then) is None


def _unproven(record: KernelRecord) -> str | None:
    m = _PREFIX.match(record.text)
    return unverified(record, m.group(2) if m else None)


def _named(record: KernelRecord, vendor: str) -> tuple[str | None, str | None]:
    """(gpu, other device): the GPU the line names, else a non-GPU PCI device it names (a PCIe port)."""
    facts = _facts(record.text)
    if facts.prefix is not None:
        return facts.prefix
    if facts.nvrm is not None:
        return facts.nvrm, None
    if record.device:
        return (record.device, None) if vendor in GPU_VENDORS else (None, record.device)
    if vendor in GPU_VENDORS and (m := _ANY_PCI.search(record.text)):  # `GPU 0000:03:00.0 ...` in the message
        return _normalized(m.group(0)), None
    return None, None


_NORMALIZED: dict[str, str] = {}  # an address as a line wrote it -> normalize_pci of it: a storm repeats a few
_SEEN_MAX = 1024  # texts whose facts are kept (the caches below and Classifier._seen): a storm repeats a few lines


class _Facts(NamedTuple):
    """What a fault line's text says, whatever its record and the classifier's state: read once per text (a storm
    repeats a few lines), kept in _FACTS."""

    process: dict | None  # process_named
    caused_by: int | None  # an Xid's "caused by previous Xid N"
    pasid: int | None  # amdgpu's faulting address space
    prefix: tuple[str | None, str | None] | None  # _named's answer from a dev_printk prefix
    nvrm: str | None  # the GPU an NVRM line names


_FACTS: dict[str, _Facts] = {}


def _device_group(m: re.Match[str]) -> str | None:
    """The device of a rule's dev_printk prefix (asked, not looked up in `groupindex`: a copy of the combined
    expression's ~100 groups, each time)."""
    try:
        return m.group("dev")
    except IndexError:  # an expression without a device prefix (GHES_RULE's)
        return None


def _facts(text: str) -> _Facts:
    if (found := _FACTS.get(text)) is None:
        if len(_FACTS) >= _SEEN_MAX:  # bounded: texts come from lines
            _FACTS.clear()
        cause, pasid = _CAUSED_BY.search(text), _PASID.search(text)
        prefix = nvrm = None
        if m := _PREFIX.match(text):
            address = _normalized(m.group(2))
            prefix = (address, None) if m.group(1) in GPU_DRIVERS else (None, address)
        elif "NVRM" in text and (m := _NVRM_PCI.search(text)):
            nvrm = _normalized(m.group(1))
        found = _FACTS[text] = _Facts(process_named(text), int(cause.group(1)) if cause else None,
                                      int(pasid.group(1)) if pasid else None, prefix, nvrm)
    return found


def _normalized(address: str) -> str:
    if (found := _NORMALIZED.get(address)) is None:
        if len(_NORMALIZED) >= 4096:  # bounded: addresses come from lines
            _NORMALIZED.clear()
        found = _NORMALIZED[address] = normalize_pci(address)
    return found


def unverified(record: KernelRecord, device: str | None) -> str | None:
    """Why the kernel's own record does not prove that a driver printed this line; None when it does.

    A line from /dev/kmsg or the journal was printed by the kernel when its facility is the kernel's (user space
    cannot write facility 0 to /dev/kmsg), and a line with a device prefix (`amdgpu 0000:03:00.0: `, printed by
    dev_printk) carries that device as the record's own metadata (kmsg's SUBSYSTEM=/DEVICE=, the journal's
    _KERNEL_SUBSYSTEM/_KERNEL_DEVICE), which no text a user chose can add. A saved or followed text log carries
    neither: anyone who can log (`logger -t kernel`) can write a line that looks the same.
    """
    if not record.metadata:
        return _TEXT_LOG
    if record.facility:
        return f"written to /dev/kmsg by user space (facility {record.facility}), not by the kernel"
    if device is not None and (record.subsystem != "pci" or record.device != normalize_pci(device)):
        return f"no kernel device metadata for {device} (dev_printk always adds it)"
    return None
