"""Golden messages: what the person woken at 3 a.m. reads, one file per situation (tests/data/golden/alerts/).

Each situation's events go through the real storm control (group window, one page per incident, follow-ups)
and are composed as the alerter does; the plain text (`.txt`, what ntfy, SMS and e-mail show) and the Markdown
(`.md`) of every message are compared with the files. After a deliberate change of the text, regenerate them
with `GPUWARDEN_REGEN_GOLDEN=1 pytest tests/unit/test_golden_alerts.py` and read every changed file as the person
woken by it before committing.
"""

from __future__ import annotations

import os
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest

from gpuwarden import recovery
from gpuwarden.alert.context import Context
from gpuwarden.alert.messages import compose
from gpuwarden.alert.storm import StormControl
from gpuwarden.model import Event, Severity
from paths import ROOT

GOLDEN = ROOT / "tests" / "data" / "golden" / "alerts"
REGEN = os.environ.get("GPUWARDEN_REGEN_GOLDEN") == "1"
T0 = datetime(2026, 12, 4, 2, 12, 7, tzinfo=UTC).timestamp()  # 03:12:07 in the reader's zone
GPU0, GPU1 = "ffff:03:00.0", "ffff:04:00.0"
CTX = Context("vm", {GPU0: (0, "Radeon AI PRO R9700"), GPU1: (1, "Radeon AI PRO R9700")},
              {"qwen-72b": frozenset({GPU0}), "llama-8b": frozenset({GPU1})}, timezone(timedelta(hours=1), "CET"))
C, W, I = Severity.CRITICAL, Severity.WARNING, Severity.INFO


def decision(action, engine, reason, by_hand=False, dry_run=False):
    return {"action": action, "engine": engine, "reason": reason, "by_hand": by_hand, "dry_run": dry_run}


def ev(at, kind, severity, message, incident="20261204-031207-engine_stall", **fields):
    """As the hub records it: with its incident, and the policy's decision (none wanted, unless given)."""
    evidence = {"decision": [], **fields.pop("evidence", {})}
    if incident:
        evidence["incident"] = incident
    return at, Event(kind, severity, message, T0 + at, evidence=evidence, **fields)


STALL = ev(0, "engine_stall", C, "qwen-72b: 4 request(s) running and no token processed for 120 s (threshold 60 s)",
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

BEFORE = {gpu: recovery.GpuState(gpu, "amd", "Radeon AI PRO R9700", "amdgpu", ((0, 32 << 30), (2, 2 << 20)),
                                  ((gpu, 16.0, 16),), True) for gpu in (GPU0, GPU1)}
LOST = "20261204-031207-reset_failed"

SITUATIONS = {
    "stall_kill": [STALL, KILLED],
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
                             "seq=1203", "history": "logged before gpuwarden started",
                     "decision": [decision("refuse", "llama-8b", "history: logged before gpuwarden started")]}),
    ],
    "crash_loop": [
        ev(0, "engine_crash_loop", C, "llama-8b exited 5 times within 600 s", engine="llama-8b",
           incident="20261204-031207-engine_crash_loop", evidence={"exits": 5, "decision": [
               decision("quarantine", None, "crash_loop", dry_run=True)]}),
    ],
    "quarantine": [
        ev(0, "engine_crash_loop", C, "llama-8b exited 5 times within 600 s", engine="llama-8b",
           incident="20261204-031207-engine_crash_loop", evidence={"exits": 5, "decision": [
               decision("quarantine", None, "crash_loop")]}),
        ev(1, "cache_poisoned", W, "moved 1 poisoned compile cache aside: /home/llm/.cache/vllm/torch_compile_cache "
                                   "-> /home/llm/.cache/vllm/torch_compile_cache.BROKEN-20261204T031208-crash_loop "
                                   "(14 zero-byte files)", engine="llama-8b",
           incident="20261204-031207-engine_crash_loop"),
    ],
    # after the reboot, the verdicts as recovery.py makes them (the incident that lost GPU 0 in the last boot)
    "gpus_back": [(0, recovery.verdict_event(recovery.compare(BEFORE, BEFORE), LOST, [GPU0], T0,
                                                            BEFORE))],
    "gpus_missing": [(0, recovery.verdict_event(recovery.compare(BEFORE, {GPU1: replace(
        BEFORE[GPU1], links=((GPU1, 16.0, 4),))}), LOST, [GPU0], T0))],
    # on_stall = "alert": the message says so, without hedging; the stall ends by itself, told on its page
    "stall_alert_only": [
        (0, replace(STALL[1], evidence={**STALL[1].evidence, "decision": [
            decision("alert_only", "qwen-72b", 'on_stall = "alert"')]})),
        (95, ("resolve", STALL[1].dedupe_key, "qwen-72b makes progress again: 1,250 tokens in the last 5 s")),
    ],
    "kill_refused": [
        (0, replace(STALL[1], evidence={**STALL[1].evidence, "decision": [
            decision("refuse", "qwen-72b", "its kill budget (3 per 3600 s) is spent", by_hand=True)]})),
        ev(1, "kill_refused", C, "qwen-72b should be killed (stalled) but its kill budget (3 per 3600 s) is spent: "
                                 "act by hand", engine="qwen-72b", evidence={"reason": "stalled"}),
    ],
}


def messages(events):
    storm, sent = StormControl(cooldown=600, group_window=5), []
    for at, event in [*events, (10_000, None)]:
        sent += storm.due(T0 + at)
        if isinstance(event, tuple):  # a condition that ended by itself
            sent += [out for out in [storm.resolve(*event[1:])] if out]
        elif event is not None:
            storm.offer(event, len(sent), T0 + at)
    return [compose(out, CTX, f"gw-{n:04d}", out.incident and f"/var/lib/gpuwarden/incidents/{out.incident}")
            for n, out in enumerate(sent, 1)]


def render(situation, markdown):
    parts = []
    for n, m in enumerate(messages(SITUATIONS[situation]), 1):
        parts.append(f"===== message {n} ({'all-clear, ' if m.resolved else ''}routed as {m.severity}) =====\n"
                     f"{m.title}\n\n"
                     + (m.body if markdown else m.text))
    return "\n\n".join(parts) + "\n"


def test_the_docs_show_golden_messages_as_they_are():
    docs = (ROOT / "docs" / "pages.md").read_text()
    for situation in ("restart_back", "gpu_lost_with_engines", "gpus_missing"):
        assert render(situation, False).rstrip() in docs, f"docs/pages.md shows an old {situation} message"
    readme = (ROOT / "README.md").read_text()
    for situation in ("restart_back", "gpu_lost_with_engines"):
        assert render(situation, False).rstrip() in readme, f"README.md shows an old {situation} message"


@pytest.mark.parametrize("situation", sorted(SITUATIONS))
@pytest.mark.parametrize("suffix", [".txt", ".md"])
def test_golden(situation, suffix):
    text = render(situation, suffix == ".md")
    path = GOLDEN / f"{situation}{suffix}"
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run with GPUWARDEN_REGEN_GOLDEN=1 and read it"
    assert text == path.read_text(), f"{path} differs (a deliberate change: GPUWARDEN_REGEN_GOLDEN=1, then read it)"
