"""Metric families are declared once (families.py) and used through their handles: an undeclared family or a
wrong number of labels is refused, and no source file names a family by a string."""

import ast

import pytest

from gpuwarden.core import families
from gpuwarden.core.families import FAMILIES, Family
from gpuwarden.core.metrics import SelfMetrics
from paths import ROOT

SRC = ROOT / "src" / "gpuwarden"


@pytest.mark.parametrize("use", [
    lambda m: m.inc("gpuwarden_event_total", "xid", "warning"),  # a typo of gpuwarden_events_total
    lambda m: m.set(Family("gpuwarden_new_gauge", "gauge", "never declared"), 1.0),
    lambda m: m.set(families.ENGINE_UP._replace(labels=("engine", "gpu")), 1.0, "e", "g"),  # not the declared one
    lambda m: m.replace("gpuwarden_gpu_power", {}),
], ids=["typo", "undeclared-handle", "altered-handle", "typo-replace"])
def test_an_undeclared_family_cannot_be_used(use):
    with pytest.raises(KeyError, match="undeclared metric family"):
        use(SelfMetrics())


@pytest.mark.parametrize("use", [
    lambda m: m.inc(families.EVENTS, "xid"),
    lambda m: m.set(families.LOOP_LAG, 0.1, "extra"),
    lambda m: m.replace(families.GPU_POWER, {("0000:03:00.0", "amd"): 300.0}),
], ids=["inc", "set", "replace"])
def test_labels_must_fit_the_declaration(use):
    with pytest.raises(ValueError, match="has labels"):
        use(SelfMetrics())


def test_a_handle_and_its_declared_name_are_one_series():
    metrics = SelfMetrics()
    metrics.inc(families.ENGINE_KILLS, "e")
    metrics.inc("gpuwarden_engine_kills_total", "e", by=2)
    assert metrics.snapshot()["gpuwarden_engine_kills_total"] == {("e",): 3}


def _modules():
    return [(p, ast.parse(p.read_text())) for p in sorted(SRC.rglob("*.py")) if p.name != "families.py"]


def test_no_source_names_a_family_by_string_and_every_family_is_used():
    named = [f"{p.relative_to(SRC)}:{node.lineno}: {node.value}" for p, tree in _modules() for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in FAMILIES]
    assert named == [], "use the handle in gpuwarden/core/families.py"
    used = {node.attr for _, tree in _modules() for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id in ("families", "f")}
    handles = {k for k, v in vars(families).items() if isinstance(v, Family)}
    assert handles - used == set(), "declared but never written: delete it or use it"
