"""The catalog of kinds is the one place that knows each kind: every kind an event is made with is in it, every
runbook it names exists, and every runbook is reachable."""

import ast
from pathlib import Path

import gpuwarden
from gpuwarden.alert.runbooks import RUNBOOKS, SITUATIONAL, runbook_for
from gpuwarden.core import conditions, policy
from gpuwarden.core.eventkinds import (
    ACTION_KINDS,
    CATALOG,
    ENGINE_KINDS,
    ESCALATION_KINDS,
    GPU_FAULT_KINDS,
    GPU_LOST_KINDS,
    OUTCOMES,
    QUARANTINE_KINDS,
    words,
)
from gpuwarden.core.model import ConditionKind as C
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


def test_one_row_holds_what_the_tables_beside_it_held():
    """Issue 35: a kind's conditions, title words and meaning to the policy were tables in conditions.py,
    alert/titles.py and policy.py; each is read off the kind's row now, and says what the tables said."""
    lost = (C.GPU_LOST,)
    assert {
        "engine_stall": (C.ENGINE_STALLED,), "engine_unresponsive": (C.ENGINE_UNRESPONSIVE,),
        "engine_killed": (C.ENGINE_DOWN,), "engine_exited": (C.ENGINE_DOWN,), "engine_crash_loop": (C.ENGINE_DOWN,),
        "engine_not_answering": (C.ENGINE_DOWN,), "engine_restart_failed": (C.ENGINE_DOWN,),
        "engine_restarting": (C.ENGINE_RESTARTING,), "store_unwritable": (C.STORE_UNWRITABLE,),
        **{kind: lost for kind in GPU_LOST_KINDS}} == conditions.RAISES
    assert {
        "engine_killed": (C.ENGINE_STALLED, C.ENGINE_UNRESPONSIVE),
        "engine_exited": (C.ENGINE_STALLED, C.ENGINE_UNRESPONSIVE),
        "engine_back": (C.ENGINE_STALLED, C.ENGINE_UNRESPONSIVE, C.ENGINE_DOWN, C.ENGINE_RESTARTING),
        "engine_restart_failed": (C.ENGINE_RESTARTING,), "gpus_back": lost, "gpus_changed": lost} == conditions.RESOLVES
    assert {"gpu_reset", "reset_failed", "device_lost", "gpu_wedged"} == ESCALATION_KINDS
    assert {"engine_crash_loop"} == QUARANTINE_KINDS
    assert words("device_lost") == "fell off the bus" and words("engine_stall") == "stalled"
    assert words("engine_killed") is None and words("a user rule's kind") is None
    assert not hasattr(policy, "ESCALATION_KINDS") or policy.ESCALATION_KINDS is ESCALATION_KINDS
