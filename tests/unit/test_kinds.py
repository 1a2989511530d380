"""The catalog of kinds is the one place that knows each kind: every kind an event is made with is in it, every
runbook it names exists, and every runbook is reachable."""

import ast
from pathlib import Path

import gpuwarden
from gpuwarden.alert.runbooks import RUNBOOKS, SITUATIONAL, runbook_for
from gpuwarden.core.eventkinds import ACTION_KINDS, CATALOG, ENGINE_KINDS, GPU_FAULT_KINDS, GPU_LOST_KINDS, OUTCOMES
from gpuwarden.kernel import rules

SRC = Path(gpuwarden.__file__).parent


def kinds_made_in_source() -> dict[str, str]:
    """Each literal kind given to Event(...) or to a helper that makes one (`_event`), with where."""
    found = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
                    in ("Event", "_event")):
                continue
            kind = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "kind"), None)
            if isinstance(kind, ast.Constant):
                found[kind.value] = f"{path.relative_to(SRC)}:{node.lineno}"
    return found


def test_every_kind_an_event_is_made_with_is_in_the_catalog():
    made = kinds_made_in_source()
    assert len(made) > 20  # the scan sees the source
    assert {k: where for k, where in made.items() if k not in CATALOG} == {}
    rule_kinds = {r.kind for r in rules.RULES} | {c.emit for c in rules.CORRELATIONS if c.emit}
    assert rule_kinds - set(CATALOG) == set()


def test_every_runbook_named_exists_and_every_runbook_is_named():
    named = {k.runbook for k in CATALOG.values() if k.runbook}
    assert named - set(RUNBOOKS) == set()
    by_rules = {r.runbook for r in rules.RULES} | {c.runbook for c in rules.CORRELATIONS if c.emit}
    assert set(RUNBOOKS) - named - by_rules - SITUATIONAL == set()


def test_the_event_s_own_runbook_wins_over_its_kind_s():
    assert runbook_for("gpu_wedged") == RUNBOOKS["device_lost"]
    assert runbook_for("gpu_wedged", "reset") == RUNBOOKS["reset"]
    assert runbook_for("engine_killed") is None and runbook_for("not_a_kind") is None


def test_actions_are_outcomes_and_no_outcome_is_a_gpu_fault():
    assert {"engine_killed", "cache_poisoned", "engine_restarting"} == ACTION_KINDS
    assert ACTION_KINDS | {"kill_refused", "kill_not_done", "engine_back", "engine_restart_failed",
                           "engine_restart_retrying"} == OUTCOMES
    assert {"sq_intr", "ring_timeout", "page_fault"} == GPU_FAULT_KINDS


def test_the_node_conditions_kinds():
    assert {"device_lost", "reset_failed", "gpu_wedged", "gpu_missing", "gpu_unresponsive", "xid"} == GPU_LOST_KINDS
    assert {"engine_stall", "engine_unresponsive", "engine_crash_loop", "kill_refused", "kill_not_done",
            "engine_killed", "engine_restarting", "engine_back", "engine_restart_failed", "engine_not_answering",
            "engine_restart_retrying", "engine_port_taken"} == ENGINE_KINDS
