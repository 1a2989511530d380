"""docs/architecture.md stays true: every arrow of its walks joins two modules that exist, as the arrow says, and
the counts it states are the walks' own. An arrow `a → b name` is a call from a into a module a imports: `name` is
defined in b and called (or handed to a pool) in a. `a ⇢ b name` is a call through a port handed at construction:
`name` is defined in b and called in a, or handed over by the daemon (`.name`). `a ⇒ b` is the one queue: a puts on
it, b awaits it. Each walk enters each module as often as its counts say.

The hub's part of each walk is generated from the code, both ways: its hops are the calls the hub's declared
stages make (`Hub.stages` in hub/hub.py, each stage's `run` read with the hub's own helpers it calls), and each walk
draws every one of them, in their order, or names it under "Not taken here" (a branch this walk does not take):
a hop the doc draws that the stages do not make fails, and so does one they make that the doc leaves out."""

import ast
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


HUB = "hub/hub.py"
NOT_TAKEN = re.compile(r"Not taken here: (.*?)\.\n", re.S)
HOP = re.compile(r"`(\S+\.py) ([→⇢]) (\S+\.py) (\w+)`")


def not_taken() -> list[list[Arrow]]:
    """Each walk's hub hops it names as not taken (a branch of the stages this walk does not go down)."""
    text = DOC.read_text()
    found = []
    for _, rest in re.findall(r"```walk\n(.*?)```(.*?)(?=```walk|\Z)", text, re.S):
        named = NOT_TAKEN.search(rest)
        found.append([m.groups() for m in HOP.finditer(named[1])] if named else [])
    return found


def _imported(tree: ast.Module) -> dict[str, str]:
    """A name the module imports from gpuwarden -> the module path it comes from (a module: itself)."""
    names = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpuwarden"):
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                path = dotted.removeprefix("gpuwarden.").replace(".", "/") + ".py"
                names[alias.asname or alias.name] = path if (SRC / path).exists() else \
                    node.module.removeprefix("gpuwarden.").replace(".", "/") + ".py"
    return names


def _implementor(methods: set[str]) -> str:
    """The one module the daemon wires from (it hands the hub its port) that defines every method of a port."""
    found = [str(path.relative_to(SRC)) for path in sorted(SRC.rglob("*.py"))
             if path.name != "hub.py" and imports("daemon.py", str(path.relative_to(SRC)))
             and all(re.search(rf"\bdef {m}\(", path.read_text()) for m in methods)]
    assert len(found) == 1, f"the port {methods} is implemented by {found}"
    return found[0]


def pipeline_hops() -> list[Arrow]:
    """The hub's hops, in order, as the code makes them (one per call site): Hub.stages' classes, each one's
    `run`, following a call to a hub class's own `run` (Changed); a call `x.name(...)` is a hop where x is a
    module hub/hub.py imports, or an attribute set from a parameter typed with a class it imports (→) or with a
    Protocol of its own (⇢, to the module that implements it), and `name` is a function that module defines.
    Arguments are entered before the call they are given to."""
    tree = ast.parse(source(HUB))
    imported = _imported(tree)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    ports = {name: {f.name for f in node.body if isinstance(f, ast.FunctionDef)} for name, node in classes.items()
             if any(getattr(b, "id", None) == "Protocol" for b in node.bases)}

    def method(cls: str, name: str) -> ast.FunctionDef:
        return next(f for f in classes[cls].body if isinstance(f, ast.FunctionDef) and f.name == name)

    def typed(cls: str) -> dict[str, tuple[str, str]]:
        """self.attr -> (kind, module path or hub class) from __init__'s annotated parameters."""
        init = next((f for f in classes[cls].body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        found = {}
        for arg in init.args.args[1:] if init else []:
            for part in ast.walk(arg.annotation) if arg.annotation else ():
                if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id in imported:
                    found.setdefault(arg.arg, ("→", imported[part.value.id]))  # report.Incidents
                elif isinstance(part, ast.Name) and part.id in ports:
                    found.setdefault(arg.arg, ("⇢", _implementor(ports[part.id])))
                elif isinstance(part, ast.Name) and part.id in classes:
                    found.setdefault(arg.arg, ("", part.id))  # a hub class: its calls are the hub's
                elif isinstance(part, ast.Name) and part.id in imported:
                    found.setdefault(arg.arg, ("→", imported[part.id]))
        return found

    hops: list[Arrow] = []

    def calls_in(cls: str, function: ast.FunctionDef) -> None:
        attributes = typed(cls)

        def visit(node: ast.AST) -> None:
            if isinstance(node, ast.Call):
                for child in [*node.args, *(k.value for k in node.keywords)]:
                    visit(child)
                visit(node.func)
                hop(node.func)
                return
            for child in ast.iter_child_nodes(node):
                visit(child)

        def hop(func: ast.expr) -> None:
            if not isinstance(func, ast.Attribute):
                return
            owner = func.value
            if isinstance(owner, ast.Name) and owner.id in imported:  # policy.decide
                target, kind = imported[owner.id], "→"
            elif isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name) and owner.value.id == "self" \
                    and owner.attr in attributes:  # self.store.add_events
                kind, target = attributes[owner.attr]
                if not kind:  # a hub class of its own: its method is part of this stage
                    calls_in(target, method(target, func.attr))
                    return
            else:
                return
            if defines(target, func.attr):
                hops.append((HUB, kind, target, func.attr))

        for statement in function.body:
            visit(statement)

    init = method("Hub", "__init__")
    stages = next(node.value for node in ast.walk(init) if isinstance(node, ast.AnnAssign | ast.Assign)
                  and "stages" in ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target))
    made = {ast.unparse(n.targets[0]): n.value.func.id for n in ast.walk(init)
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name)}
    for element in stages.elts:
        cls = element.func.id if isinstance(element, ast.Call) else made[ast.unparse(element)]
        calls_in(cls, method(cls, "run"))
    return hops


def test_the_hub_s_hops_are_the_stages_own_both_ways():
    """Each walk's hub hops are the stages' calls, in their order, less those it names as not taken."""
    made = pipeline_hops()
    for (arrows, _), skipped in zip(walks(), not_taken(), strict=True):
        drawn = [a for a in arrows if a[0] == HUB]
        assert [a for a in drawn if a not in made] == [], "a hub hop the stages do not make"
        assert [a for a in skipped if a not in made] == [], "a hop named not taken that the stages do not make"
        assert [a for a in made if a not in drawn and a not in skipped] == [], "a hop of the stages left out"
        assert set(drawn).isdisjoint(skipped)
        rest = iter(made)
        assert all(any(a == b for b in rest) for a in drawn), "the hub's hops out of the stages' order"


def test_the_hub_is_its_declared_stages():
    """decide → conditions → incidents → store → alert → act (Alertmanager's notify.Stage): the hub holds the
    list, in that order, and each stage is a small object with one method, `run`."""
    tree = ast.parse(source(HUB))
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    init = next(f for f in classes["Hub"].body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    stages = next(node.value for node in ast.walk(init) if isinstance(node, ast.AnnAssign)
                  and ast.unparse(node.target) == "self.stages")
    made = {ast.unparse(n.targets[0]): n.value.func.id for n in ast.walk(init)
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name)}
    order = [e.func.id if isinstance(e, ast.Call) else made[ast.unparse(e)] for e in stages.elts]
    assert order == ["Decide", "Conditions", "Incidents", "Record", "Alert", "Act"]
    for name in order:
        public = [f.name for f in classes[name].body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")]
        assert public == ["run"], f"{name}: {public}"
    run = next(f for f in classes["Hub"].body if isinstance(f, ast.FunctionDef) and f.name == "_record")
    assert "for stage in self.stages" in ast.unparse(run)  # the events go through the list, nothing beside it


def test_the_stages_hops_are_read_from_the_code():
    made = pipeline_hops()
    assert made[0] == (HUB, "→", "core/policy.py", "decide")  # the policy first
    assert (HUB, "→", "alert/alerter.py", "submit") in made and (HUB, "⇢", "engine/watch.py", "learn") in made
    assert (HUB, "→", "core/conditions.py", "series") in made  # through the hub's own Changed
    assert made.index((HUB, "→", "core/conditions.py", "series")) < made.index((HUB, "→", "core/metrics.py", "replace"))
    assert made.count((HUB, "→", "runtime/logsetup.py", "event_fields")) == 2  # a resolution's line, an event's


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
        assert imports(a, b), f"{a} does not import {b}"
        assert defines(b, name) and calls(a, name), f"{a} does not call {b}'s {name}"


def test_the_stated_counts_are_the_walks_own():
    for arrows, (modules, hops, twice) in walks():
        assert (len({m for a, _, b, _ in arrows for m in (a, b)}), len(arrows)) == (modules, hops)
        assert entered_twice(arrows) == twice, "a module entered twice that the counts do not state (or not)"


def test_every_walk_enters_each_component_once():
    """A fault, a stall and an action's outcome (issue 25's acceptance): the stall's kill takes the look that
    found the stall, and its lifecycle learns the kill from the outcome, in walk 3. Only the hub enters a module
    again, and only below it in the foundation, the store and the alerter, or its own incidents component (each
    call returns to the hub)."""
    for arrows, _ in walks():
        again = entered_twice(arrows)
        assert [m for m in again if m.split("/")[0] not in ("core", "store", "alert") and m != "hub/tracker.py"] == []


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
