"""docs/architecture.md stays true: every arrow of its walks joins two modules that exist, as the arrow says, and
the counts it states are the walks' own. An arrow `a → b name` is a call into a module one of them imports from
the other: `name` is defined in one and called (or handed to a pool) in the other. `a ⇢ b name` is a call through
a port handed at construction: `name` is defined in b and called in a, or handed over by the daemon (`.name`).
`a ⇒ b` is the one queue: a puts on it, b awaits it. Each walk enters each module once, unless its counts say
which it enters twice (no walk may enter one twice)."""

import re
from pathlib import Path

import pytest
from test_imports import SRC

DOC = SRC.parent.parent / "docs" / "architecture.md"
ARROW = re.compile(r"^(\S+\.py)\s+([→⇢⇒])\s+(\S+\.py)\s+(\w+)")
COUNTED = re.compile(r"Counted: (\d+) modules entered, (\d+) hops; entered twice: (none|`[^`]+`(?:, `[^`]+`)*)\.")

Arrow = tuple[str, str, str, str]


def walks() -> list[tuple[list[Arrow], tuple[int, int, list[str]]]]:
    text = DOC.read_text()
    found = []
    for block, rest in re.findall(r"```walk\n(.*?)```(.*?)(?=```walk|\Z)", text, re.S):
        arrows = [m.groups() for line in block.splitlines() if (m := ARROW.match(line))]
        assert len(arrows) == len(block.strip().splitlines()), "a line of a walk that is not an arrow"
        counted = COUNTED.search(rest)
        assert counted, "a walk without its counts"
        twice = [] if counted[3] == "none" else re.findall(r"`([^`]+)`", counted[3])
        found.append((arrows, (int(counted[1]), int(counted[2]), twice)))
    return found


def source(module: str) -> str:
    path = SRC / module
    assert path.exists(), f"{module}: no such module"
    return path.read_text()


def imports(a: str, b: str) -> bool:
    dotted = "gpuwarden." + b.removesuffix(".py").replace("/", ".")
    package, _, name = dotted.rpartition(".")
    text = source(a)
    return (f"from {dotted} import" in text or f"import {dotted}" in text
            or re.search(rf"from {re.escape(package)} import [^\n]*\b{name}\b", text) is not None)


def defines(module: str, name: str) -> bool:
    return re.search(rf"\bdef {name}\(", source(module)) is not None


def calls(module: str, name: str) -> bool:
    """Called, or handed to an off-loop pool (`pool.run(..., kill, ...)`)."""
    return re.search(rf"(?<!def )\b{name}(\(|, )", source(module)) is not None


def entered_twice(arrows: list[Arrow]) -> list[str]:
    """Walk the hops as calls: a callee is entered; a call returns to its caller (what the caller called before
    is left); across the queue everything is left (the consumer runs on its own). The modules entered a second
    time, in order; a module that calls on after it was left fails."""
    stack, entered, twice = [arrows[0][0]], {arrows[0][0]}, []
    for a, kind, b, name in arrows:
        assert a in stack, f"{a} calls {b}.{name} after it was left"
        stack = [] if kind == "⇒" else stack[:stack.index(a) + 1]
        if b in entered:
            twice.append(b)
        entered.add(b)
        stack.append(b)
    return twice


def test_the_document_has_its_three_walks():
    assert len(walks()) == 3  # a fault, a stall, an action's outcome


@pytest.mark.parametrize("arrow", [a for arrows, _ in walks() for a in arrows], ids=" ".join)
def test_each_arrow_is_in_the_code(arrow):
    a, kind, b, name = arrow
    if kind == "⇒":
        assert "put_nowait(" in source(a) and "await self.reports.get()" in source(b)
    elif kind == "⇢":
        assert defines(b, name), f"{b} does not define {name}"
        assert calls(a, name) or f".{name}" in source("daemon.py"), f"{a} is not handed {name}"
    else:
        assert imports(a, b) or imports(b, a), f"neither of {a}, {b} imports the other"
        assert (defines(b, name) and calls(a, name)) or (defines(a, name) and calls(b, name)), f"{a} → {b}: {name}"


def test_the_stated_counts_are_the_walks_own():
    for arrows, (modules, hops, twice) in walks():
        assert (len({m for a, _, b, _ in arrows for m in (a, b)}), len(arrows)) == (modules, hops)
        assert entered_twice(arrows) == twice, "a module entered twice that the counts do not state (or not)"


def test_every_walk_enters_each_module_once():
    """A fault, a stall and an action's outcome (issue 25's acceptance): the stall's kill takes the look that
    found the stall, and its lifecycle learns the kill from the outcome, in walk 3."""
    (fault, _), (stall, _), (outcome, _) = walks()
    assert entered_twice(fault) == [] and entered_twice(stall) == [] and entered_twice(outcome) == []


def test_a_doubled_entry_is_caught():
    once = [("hub/hub.py", "→", "core/policy.py", "decide"), ("hub/hub.py", "→", "act/actuator.py", "execute"),
            ("act/actuator.py", "→", "act/killer.py", "kill")]
    assert entered_twice(once) == []
    # the actuator asks the policy again: entered twice (the walk as it was before `take`)
    assert entered_twice([*once, ("act/actuator.py", "→", "core/policy.py", "target_refusal")]) == ["core/policy.py"]
    # an outcome handed back across the queue enters the hub again
    again = [*once, ("act/actuator.py", "⇢", "hub/queue.py", "record"), ("hub/queue.py", "⇒", "hub/hub.py", "run")]
    assert entered_twice(again) == ["hub/hub.py"]
    with pytest.raises(AssertionError, match="after it was left"):  # the policy left, then calling on
        entered_twice([*once, ("core/policy.py", "→", "core/conditions.py", "apply")])


def test_a_false_arrow_is_caught():
    assert not imports("kernel/watch.py", "act/killer.py") and not imports("act/killer.py", "kernel/watch.py")
    assert not defines("hub/hub.py", "kill")
    with pytest.raises(AssertionError):
        source("kernel/nothing.py")


def test_the_doc_is_found():
    assert Path(DOC).exists()
