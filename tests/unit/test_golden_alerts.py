"""Golden messages: what the person woken at 3 a.m. reads, one file per situation (tests/data/golden/alerts/).

Where a situation can be played here by the real daemon (a stall and its kill, a kill not done, a kill that
leaves a process stuck in the kernel, a hung /metrics, a spent kill budget, an engine that never answers, a crash
loop with and without the quarantine, a stall only alerted), its golden text is made by the real path: the
scenario recorded from the running daemon (tests/integration/test_golden_scenarios.py,
tests/data/golden/scenarios/) is replayed through a real alerter (tests/golden.py), read in the CET zone. The
others cannot happen on this box (HAND_BUILT says why, and so does each one's golden file): their events are
written as their makers write them and go through the real storm control and composer, as the alerter does.
The plain text (`.txt`, what ntfy, SMS and e-mail show) and the Markdown (`.md`) of every message are compared
with the files. After a deliberate change of
the text, regenerate them with `GPUWARDEN_REGEN_GOLDEN=1 pytest tests/unit/test_golden_alerts.py` and read every
changed file as the person woken by it before committing.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

import golden
from gpuwarden.alert.context import Context, Runs
from gpuwarden.alert.messages import compose
from gpuwarden.alert.storm import StormControl
from gpuwarden.config.settings import KernelConfig
from gpuwarden.core.model import Event, Severity
from gpuwarden.gpu import recovery
from gpuwarden.kernel.formats import parse_lines
from gpuwarden.kernel.watch import classifier_for
from paths import ROOT

GOLDEN = ROOT / "tests" / "data" / "golden" / "alerts"
REGEN = os.environ.get("GPUWARDEN_REGEN_GOLDEN") == "1"
T0 = datetime(2026, 12, 4, 2, 12, 7, tzinfo=UTC).timestamp()  # 03:12:07 in the reader's zone
GPU0, GPU1 = "ffff:03:00.0", "ffff:04:00.0"
CET = timezone(timedelta(hours=1), "CET")
INCIDENTS = "/var/lib/gpuwarden/incidents"
# qwen-72b runs as a systemd unit, llama-8b in a Docker container: the pages name them and their commands
CTX = Context("vm", {GPU0: (0, "Radeon AI PRO R9700"), GPU1: (1, "Radeon AI PRO R9700")},
              {"qwen-72b": frozenset({GPU0}), "llama-8b": frozenset({GPU1})}, CET,
              {"qwen-72b": Runs(unit="vllm-qwen.service"), "llama-8b": Runs(container="llama-8b")},
              cache_dry_run='on_crash_loop = "alert"')
C, W, I = Severity.CRITICAL, Severity.WARNING, Severity.INFO


def decision(action, engine, reason, by_hand=False, dry_run=False):
    return {"action": action, "engine": engine, "reason": reason, "by_hand": by_hand, "dry_run": dry_run}


def ev(at, kind, severity, message, incident="20261204-031207-engine_stall", **fields):
    """As the hub records it: with its incident, and the policy's decision (none wanted, unless given)."""
    evidence = {"decision": [], **fields.pop("evidence", {})}
    if incident:
        evidence["incident"] = incident
    return at, Event(kind, severity, message, T0 + at, evidence=evidence, **fields)


STALL = ev(0, "engine_stall", C, "qwen-72b: 4 requests running and no token processed for 120 s (threshold 60 s)",
           engine="qwen-72b", gpu=GPU0, evidence={
               "figures": {"running": 4, "generated_tokens": 1834112, "stalled_seconds": 120.0,
                           "threshold_seconds": 60.0, "typical_token_seconds": 0.031, "cpu_percent": 100.0},
               "spinning": True, "source": "metrics", "decision": [decision("kill", "qwen-72b", "stalled")]})
STALL_RESTART = (0, replace(STALL[1], evidence={**STALL[1].evidence,
                                               "decision": [decision("restart", "qwen-72b", "stalled")]}))
KILLED = ev(2, "engine_killed", C, "killed qwen-72b: 3 processes (stalled)", engine="qwen-72b", gpu=GPU0,
            evidence={"reason": "stalled", "terminated": ["4301", "4302", "4303"], "killed": [], "survivors": [],
                      "dry_run": False})
RESTARTING = ev(4, "engine_restarting", W, "qwen-72b: asking its systemd unit to start it again; back once a real "
                "completion returns", engine="qwen-72b", gpu=GPU0, evidence={"supervisor": "systemd unit"})

def xid_event() -> Event:
    """An Xid 13 of a driver's line, as the real classifier makes it (the real kernel watch's classifier)."""
    line = ("kern  :warn  : 2026-12-04T02:12:07,283302+00:00 NVRM: Xid (PCI:ffff:03:00): 13, pid=4301, name=python3, "
            "Graphics SM Warp Exception on (GPC 8, TPC 5, SM 1): Out Of Range Address")
    classifier = classifier_for(KernelConfig())
    [burst] = [b for r in parse_lines([line]).records for b in classifier.feed(r, T0)] + \
        classifier.flush(T0, everything=True).new
    return replace(burst.final, time=T0)


BEFORE = {gpu: recovery.GpuState(gpu, "amd", "Radeon AI PRO R9700", "amdgpu", ((0, 32 << 30), (2, 2 << 20)),
                                  ((gpu, 16.0, 16),), True) for gpu in (GPU0, GPU1)}
LOST = "20261204-031207-reset_failed"

SITUATIONS = {
    "restart_back": [STALL_RESTART, KILLED, RESTARTING, ev(
        43, "engine_back", I, "qwen-72b back: first completion 41 s after the kill", engine="qwen-72b", gpu=GPU0,
        evidence={"seconds_since_kill": 41.2, "canary": {"outcome": "ok", "seconds": 0.4}})],
    "restart_failed": [STALL_RESTART, KILLED, RESTARTING, ev(
        604, "engine_restart_failed", C, "qwen-72b is not back 600 s after gpuwarden restarted it (restart_timeout "
        "600 s): its processes started but it never completed a request; gpuwarden will not restart it again",
        engine="qwen-72b", gpu=GPU0, evidence={"waited_seconds": 600.0, "by_gpuwarden": True, "started": True})],
    "gpu_lost_with_engines": [
        ev(0, "ring_timeout", C, "a GPU ring timed out: the GPU is hung on ffff:03:00.0", gpu=GPU0, incident=LOST,
           evidence={"line": "amdgpu ffff:03:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=88213, emitted "
                             "seq=88215", "decision": [decision("kill", "qwen-72b", "kernel reported ring_timeout on "
                                                                                     "ffff:03:00.0")]}),
        ev(2, "reset_failed", C, "the GPU reset failed: the GPU is lost until a reboot on ffff:03:00.0", gpu=GPU0,
           incident=LOST, evidence={"lines": [
               "amdgpu ffff:03:00.0: amdgpu: GPU reset begin!",
               "amdgpu ffff:03:00.0: amdgpu: ring gfx_0.0.0 test failed (-110)",
               "amdgpu ffff:03:00.0: amdgpu: GPU reset(2) failed"], "runbook": "device_lost", "decision": []}),
        ev(3, "engine_killed", C, "killed qwen-72b: 3 processes (1 needed SIGKILL) (kernel reported ring_timeout on "
                                  "ffff:03:00.0)", engine="qwen-72b", gpu=GPU0, incident=LOST,
           evidence={"killed": ["4303"], "survivors": [], "dry_run": False}),
        # the telemetry sees the same GPU gone: the same fault, counted, never a second page
        ev(30, "gpu_missing", C, "ffff:03:00.0 is gone from the PCI bus", gpu=GPU0,
           incident="20261204-031237-gpu_missing", evidence={"decision": []}),
    ],
    "stranger_fault": [
        ev(0, "page_fault", C, "a GPU page fault (a bad memory access by a GPU job) on ffff:03:00.0", gpu=GPU0,
           incident="20261204-031207-page_fault", evidence={
               "lines": ["amdgpu ffff:03:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:3 pasid:32770)",
                         "amdgpu ffff:03:00.0: amdgpu:  Process python3 pid 4242 thread python3 pid 4242"],
               "process": {"pid": 4242, "name": "python3"},
               "decision": [decision("refuse", "qwen-72b", "the fault was raised by pid 4242 (python3), not one "
                                                           "of qwen-72b's processes")]}),
    ],
    "history_at_start": [
        ev(0, "ring_timeout", C, "a GPU ring timed out: the GPU is hung on ffff:04:00.0", gpu=GPU1, incident=None,
           evidence={"line": "amdgpu ffff:04:00.0: amdgpu: ring comp_1.0.0 timeout, signaled seq=1201, emitted "
                             "seq=1203", "history": "logged before gpuwarden started", "logged_at": T0 - 1834.0,
                     "decision": [decision("refuse", "llama-8b", "history: logged before gpuwarden started")]}),
    ],
    # after the reboot, the verdicts as recovery.py makes them (the incident that lost GPU 0 in the last boot)
    "gpus_back": [(0, recovery.verdict_event(recovery.compare(BEFORE, BEFORE), LOST, [GPU0], T0,
                                                            BEFORE))],
    "gpus_missing": [(0, recovery.verdict_event(recovery.compare(BEFORE, {GPU1: replace(
        BEFORE[GPU1], links=((GPU1, 16.0, 4),))}), LOST, [GPU0], T0))],
    # an NVIDIA Xid as the real classifier makes it of a driver's line, on qwen-72b's GPU
    "xid": [(0, replace(xid_event(), evidence={**xid_event().evidence, "incident": "20261204-031207-xid",
                                                "decision": [decision("kill", "qwen-72b", "kernel reported xid 13 "
                                                                                          "on ffff:03:00.0")]}))],
}


RECORDED = sorted(p.stem for p in golden.SCENARIOS.glob("*.json"))

# Why each situation above is built by hand, not recorded from the real daemon: said at the top of its golden file
_KERNEL = ("a driver's kernel line, which this box's drivers do not print: written to the real /dev/kmsg from user "
           "space it is an unverified line (facility 1, no device metadata) that gpuwarden rightly never acts on, so "
           "a recording would be another situation")
_SYSTEMD = ("a restart through a systemd unit: this box has no systemd as PID 1 (a real unit's restart is "
            "tests/integration/test_real_systemd.py's, in the nspawn lane)")
HAND_BUILT = {
    "restart_back": _SYSTEMD,
    "restart_failed": _SYSTEMD + "; and a start that runs but never serves for 600 s",
    "gpu_lost_with_engines": "a GPU ring timeout and a failed reset, " + _KERNEL,
    "stranger_fault": "a GPU page fault of another user's process, " + _KERNEL,
    "history_at_start": "a ring timeout logged before the start, " + _KERNEL,
    "gpus_back": ("the verdict made at the boot after a GPU was lost: the daemon can be shown a last boot "
                  "(tests/integration/test_recovery_boot.py), but its page then updates that boot's paged incident, "
                  "which a recording's replay (a fresh alerter) does not carry yet"),
    "gpus_missing": ("the verdict made at the boot after a GPU was lost, with a GPU still missing: the daemon waits "
                     "10 minutes for it, and its page updates the last boot's incident (see gpus_back)"),
    "xid": "an NVIDIA Xid, " + _KERNEL,
}


def header(situation) -> str:
    """The golden file's first lines: where its events come from."""
    if situation.startswith("docker_"):
        return f"# recorded from the real daemon: tests/integration/test_golden_docker.py ({situation})\n\n"
    if situation in RECORDED:
        return f"# recorded from the real daemon: tests/integration/test_golden_scenarios.py::test_{situation}\n\n"
    return f"# hand-built events (as their makers write them), not recorded: {HAND_BUILT[situation]}\n\n"


def messages(events, ctx=CTX):
    storm, sent = StormControl(cooldown=600, group_window=5), []
    for at, event in [*events, (10_000, None)]:
        sent += storm.due(T0 + at)
        if isinstance(event, tuple):  # a condition that ended by itself
            sent += [out for out in [storm.resolve(*event[1:], T0 + at)] if out]
        elif event is not None:
            storm.offer(event, len(sent), T0 + at)
    return [compose(out, ctx, f"gw-{n:04d}", out.incident and f"{INCIDENTS}/{out.incident}")
            for n, out in enumerate(sent, 1)]


def pages(situation) -> list[dict]:
    if situation in RECORDED:
        with tempfile.TemporaryDirectory() as folder:
            made = golden.replay(golden.load(situation), Path(folder) / "replay.db", CET, INCIDENTS)
        return [{**p, **{k: p[k].replace("alert id: gw-?", f"alert id: gw-{n:04d}") for k in ("body", "text")}}
                for n, p in enumerate(made, 1)]
    return [{"severity": str(m.severity), "resolved": m.resolved, "title": m.title, "body": m.body, "text": m.text}
            for m in messages(SITUATIONS[situation])]


def render(situation, markdown):
    parts = []
    for n, m in enumerate(pages(situation), 1):
        parts.append(f"===== message {n} ({'all-clear, ' if m['resolved'] else ''}routed as {m['severity']}) =====\n"
                     f"{m['title']}\n\n"
                     + (m["body"] if markdown else m["text"]))
    return "\n\n".join(parts) + "\n"


def test_the_docs_show_golden_messages_as_they_are():
    docs = (ROOT / "docs" / "pages.md").read_text()
    for situation in ("restart_back", "gpu_lost_with_engines", "gpus_missing"):
        assert render(situation, False).rstrip() in docs, f"docs/pages.md shows an old {situation} message"
    readme = (ROOT / "README.md").read_text()
    for situation in ("restart_back", "gpu_lost_with_engines"):
        assert render(situation, False).rstrip() in readme, f"README.md shows an old {situation} message"


@pytest.mark.parametrize("situation", sorted({*SITUATIONS, *RECORDED}))
@pytest.mark.parametrize("suffix", [".txt", ".md"])
def test_golden(situation, suffix):
    text = header(situation) + render(situation, suffix == ".md")
    path = GOLDEN / f"{situation}{suffix}"
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run with GPUWARDEN_REGEN_GOLDEN=1 and read it"
    assert text == path.read_text(), f"{path} differs (a deliberate change: GPUWARDEN_REGEN_GOLDEN=1, then read it)"


# what a page must never show: a count as a float, a placeholder for a name the daemon knows, a time of day
# without its zone (a quoted kernel line keeps its own stamp), one zone said twice, "(s)" or "1 processes"
# 2.0, 7910.0 as a word of its own (not a PCI address's .0, an IP address; a PCIe speed is written 16.0 GT/s)
_FLOAT = re.compile(r"(?:(?<=\s)|(?<=\())\d[\d,]*\.0(?![.\d])(?! GT/s)")
_PLACEHOLDER = re.compile(r"<[a-z][a-z ]*>")  # <its unit>, <container>
_TIME = re.compile(r"(?<![\dT:])\d{2}:\d{2}:\d{2}(?![\d,])")
_ZONED = re.compile(r"\d{2}:\d{2}:\d{2}(?: [A-Z]{3,5}\b| to \d{2}:\d{2}:\d{2} [A-Z]{3,5}\b)")
_TWICE = re.compile(r"(\d{2}:\d{2}:\d{2}) (\w+) \(\1 \2\)")
_PLURAL = re.compile(r"\(e?s\)|\b1 (?:processes|requests|tokens|tries|lines|events|kills|files|zero-byte files|"
                     r"connections|times)\b")


def faults(text: str) -> list[str]:
    found = [f"a count as a float: {m.group()!r}" for m in _FLOAT.finditer(text)]
    found += [f"a placeholder: {m.group()!r}" for m in _PLACEHOLDER.finditer(text)]
    found += [f"a time without its zone: {text[m.start():m.end() + 8]!r}" for m in _TIME.finditer(text)
              if not _ZONED.match(text, m.start())]
    found += [f"a zone said twice: {m.group()!r}" for m in _TWICE.finditer(text)]
    found += [f"a plural not made: {m.group()!r}" for m in _PLURAL.finditer(text)]
    return found


@pytest.mark.parametrize("situation", sorted({*SITUATIONS, *RECORDED}))
def test_no_page_shows_a_float_count_a_placeholder_or_a_time_without_its_zone(situation):
    for page in pages(situation):
        assert not faults(f"{page['title']}\n{page['text']}"), (page["title"], faults(page["text"]))


def test_the_check_catches_what_pages_used_to_show():
    """The old words, as pages printed them before (issue 39): each is caught."""
    for old in ("running: 2.0", "tokens_processed: 7910.0", "1 processes", "4 request(s) running",
                "When: 2026-12-04 02:12:07 UTC (02:12:07 UTC)", "(`systemctl restart <its unit>`)",
                "`docker logs <container>`", "03:12:07  killed qwen-72b"):
        assert faults(old), old
    assert not faults("When: 2026-12-04 03:12:07 CET (02:12:07 UTC); from 03:10:07 to 03:12:07 CET; 16.0 GT/s x16")


def event_messages(situation) -> list[str]:
    """The events' own messages (what `gpuwarden events`, the status page and the incident report show), as the
    daemon made them in a recorded scenario, or as their makers write them in a hand-built one."""
    if situation in RECORDED:
        calls = golden.load(situation)["calls"]
        return [*(row["message"] for call in calls for row in [*call.get("submit", ()), *filter(None, [
                    call.get("repeated")])]), *(call["resolve"][1] for call in calls if "resolve" in call)]
    return [event[2] if isinstance(event, tuple) else event.message for _, event in SITUATIONS[situation]]


@pytest.mark.parametrize("situation", sorted({*SITUATIONS, *RECORDED}))
def test_no_event_message_shows_a_float_count_or_an_unmade_plural(situation):
    """The checker above, on the events themselves: made outside alert/ (the engine watch, the actuator, the
    quarantine), they once said `2 request(s) running`, `1 processes`."""
    for message in event_messages(situation):
        assert not faults(message), (message, faults(message))


def test_the_makers_of_event_messages_count_as_people_do(tmp_path):
    """One process killed, one zero-byte file moved: the killer and the quarantine said `1 processes`, `1
    zero-byte file(s)` (their messages are the events' and the incident report's)."""
    from gpuwarden.act.killer import KillReport
    from gpuwarden.act.quarantine import quarantine_all

    said = [KillReport(["4301 python3"], [], [], False).summary("qwen-72b"),
            KillReport(["4301 python3"], [], [], True).summary("qwen-72b")]
    cache = tmp_path / "torch_compile_cache"
    cache.mkdir()
    (cache / "fx_graph_0.py").touch()
    (cache / "index.json").write_text("{}")
    said.append(quarantine_all([cache], "crash_loop", T0, dry_run=True).message)
    assert [faults(s) for s in said] == [[], [], []], said
    assert said[0] == "killed qwen-72b: 1 process"


def test_each_hand_built_golden_says_why_it_is_not_recorded():
    assert set(HAND_BUILT) == set(SITUATIONS) - set(RECORDED)


def test_a_crash_loop_only_alerted_never_says_its_caches_moved():
    """Recorded with on_crash_loop = "alert": the quarantine found the zero-byte files and moved nothing. The page
    said "compile caches moved aside" and "The cache was renamed": it tells the person to move them."""
    [*_, last] = pages("crash_loop")
    assert "moved aside" not in last["title"] and "was renamed" not in last["text"], last["text"]
    assert "gpuwarden quarantine /" in last["text"] and 'gpuwarden moved no cache: on_crash_loop = "alert"' in \
        last["text"]


def test_a_crash_loop_paged_before_its_caches_are_moved_says_gpuwarden_is_moving_them():
    """The quarantine decided, its outcome not yet known (the move outlasted the group window): the page told the
    person to run `gpuwarden quarantine` themselves, beside the decision that gpuwarden does it."""
    loop = ev(0, "engine_crash_loop", C, "llama-8b exited 5 times within 600 s", engine="llama-8b",
              incident="20261204-031207-engine_crash_loop",
              evidence={"exits": 5, "decision": [decision("quarantine", None, "crash_loop")]})
    [page] = messages([loop])
    assert "Nothing to do yet: gpuwarden looks for zero-byte files in llama-8b's compile caches" in page.text
    assert "`docker logs llama-8b`" in page.body and "gpuwarden quarantine finds them" not in page.text
