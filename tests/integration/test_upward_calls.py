"""Nothing below calls up: no part holds a callable of a higher layer than its own module's (the layers of
tests/unit/test_imports.py), except the ones docs/architecture.md names, each with why it stays.

The import rule cannot see such a call: daemon.py imports both sides and hands an upper part's bound method (or a
callable object of its own) down to a lower one, which then calls up the layers through it. So this reads the
real wiring: a Daemon is built and started in this process, and every object of a gpuwarden class it reaches is
looked at, attribute by attribute (through plain containers and partials, into bound methods' objects, and into
the locals of the tasks it runs, where the supervisor keeps what it built). A callable is a function, a bound
method, a partial, a class, or an object of a gpuwarden class with `__call__`; it comes from the module that
defines it (a bound method: its object's class). One is upward when that module's layer is above the holder's.

A port is not a call up: a bound method named by a Protocol of the holder's layer or below (core/model.Sink's
`record`, an outbox's), which the object it is bound to implements, is the lower layer's own contract."""

from __future__ import annotations

import ast
import asyncio
import collections
import functools
import importlib.util
import re
import types
from pathlib import Path

from helpers import free_port
from inprocess import daemon_in, running

from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.hub.queue import Outbox

_RULE = importlib.util.spec_from_file_location("import_rule", Path(__file__).parent.parent / "unit" / "test_imports.py")
import_rule = importlib.util.module_from_spec(_RULE)
_RULE.loader.exec_module(import_rule)  # the layers are the import rule's, in one place
LAYER, SRC, package_of = import_rule.LAYER, import_rule.SRC, import_rule.package_of

DOC = SRC.parent.parent / "docs" / "architecture.md"
_CONTAINERS = (dict, list, tuple, set, frozenset, collections.deque)
# a row of the doc's table: | `holder/module.py` Class.attribute | `callable/module.py` name | why it stays |
_ROW = re.compile(r"^\| `(\S+\.py)` (\w+)\.(\w+) \| `(\S+\.py)` ([\w.]+) \| (.+) \|$", re.M)

Found = tuple[str, str, str, str, str]  # holder module path, holder class, attribute, callable's module path, name


def _path(module: str) -> str:
    """gpuwarden.hub.health -> hub/health.py"""
    return module.removeprefix("gpuwarden.").replace(".", "/") + ".py"


def _layer(module: str) -> int:
    return LAYER[package_of(module)]


def _ours(obj) -> bool:
    return type(obj).__module__.startswith("gpuwarden.") and not isinstance(obj, type | types.ModuleType)


def ports() -> list[tuple[int, set[str]]]:
    """Each Protocol of the source: (its module's layer, its methods)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        module = "gpuwarden." + ".".join(path.relative_to(SRC).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "Protocol" for b in node.bases):
                methods = {f.name for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
                found.append((_layer(module), methods))
    return found


def _origin(value) -> tuple[str, str] | None:
    """(module, name) of a gpuwarden callable; None for anything else."""
    if isinstance(value, functools.partial):
        return _origin(value.func)
    if isinstance(value, types.MethodType):
        owner = value.__self__ if isinstance(value.__self__, type) else type(value.__self__)
        module, name = owner.__module__, f"{owner.__name__}.{value.__func__.__name__}"
    elif isinstance(value, types.FunctionType | type):
        module, name = value.__module__, value.__qualname__
    elif callable(value) and _ours(value):
        module, name = type(value).__module__, type(value).__name__
    else:
        return None
    return (module, name) if module.startswith("gpuwarden.") else None


def _is_port(value, holder_layer: int, known: list[tuple[int, set[str]]]) -> bool:
    if not isinstance(value, types.MethodType):
        return False
    name, owner = value.__func__.__name__, value.__self__
    return any(layer <= holder_layer and name in methods and all(hasattr(owner, m) for m in methods)
               for layer, methods in known)


def _fields(obj) -> dict[str, object]:
    fields = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
    for cls in type(obj).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            if hasattr(obj, slot):
                fields[slot] = getattr(obj, slot)
    return fields


def _inside(value) -> list:
    """What a plain value leads to: a container's items, a partial's arguments."""
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    if isinstance(value, _CONTAINERS):
        return list(value)
    if isinstance(value, functools.partial):
        return [*value.args, *value.keywords.values()]
    return []


def _in_task(task: asyncio.Task) -> list:
    """The parts a task's coroutines hold in their locals (a component the supervisor built for this run): walked
    as parts, not as what the task's owner holds (a supervisor runs what it is given: that is its contract)."""
    coro, parts = task.get_coro(), []
    while coro is not None and getattr(coro, "cr_frame", None) is not None:
        parts += [v for v in coro.cr_frame.f_locals.values() if _ours(v)]
        coro = coro.cr_await
    return parts


def upward_calls(root) -> set[Found]:
    return walk(root)[0]


def walk(root) -> tuple[set[Found], set[str]]:
    """Every (holder, attribute, callable) where a part holds a callable of a higher layer than its own; and the
    classes of the parts reached."""
    known, found = ports(), set()
    seen, todo, reached = {id(root)}, [root], [root]
    while todo:
        holder = todo.pop()
        module = type(holder).__module__
        for attribute, value in _fields(holder).items():
            values, looked = [value], set()
            while values:
                value = values.pop()
                if isinstance(value, asyncio.Task):
                    fresh = [p for p in _in_task(value) if id(p) not in seen]
                    seen.update(id(p) for p in fresh)
                    todo += fresh
                    reached += fresh
                    continue
                if id(value) in looked or isinstance(value, type | types.ModuleType):
                    if isinstance(value, type) and (origin := _origin(value)) and \
                            _layer(origin[0]) > _layer(module):
                        found.add((_path(module), type(holder).__name__, attribute, _path(origin[0]), origin[1]))
                    continue
                looked.add(id(value))
                origin = _origin(value)
                if origin and _layer(origin[0]) > _layer(module) and not _is_port(value, _layer(module), known):
                    found.add((_path(module), type(holder).__name__, attribute, _path(origin[0]), origin[1]))
                part = value.__self__ if isinstance(value, types.MethodType) else value  # a method: its object
                if _ours(part):
                    if id(part) not in seen:
                        seen.add(id(part))
                        todo.append(part)
                        reached.append(part)
                else:
                    values += _inside(value)
    return found, {type(part).__name__ for part in reached}


def named_in_the_doc() -> dict[Found, str]:
    """The exceptions docs/architecture.md names: each with why it stays."""
    return {(m[1], m[2], m[3], m[4], m[5]): m[6] for m in _ROW.finditer(DOC.read_text())}


class Low:
    """Stands for a lower part (its module is set to a component's below)."""

    def __init__(self, told) -> None:
        self.told = told


class High:
    def tell(self) -> None:
        pass

    def __call__(self) -> None:
        pass


def test_the_walk_sees_a_callable_handed_down_and_not_a_port(monkeypatch):
    monkeypatch.setattr(Low, "__module__", "gpuwarden.kernel.watch")
    monkeypatch.setattr(High, "__module__", "gpuwarden.hub.hub")
    high = High()
    assert upward_calls(Low(high.tell)) == {("kernel/watch.py", "Low", "told", "hub/hub.py", "High.tell")}
    assert upward_calls(Low([functools.partial(high)])) == {("kernel/watch.py", "Low", "told", "hub/hub.py", "High")}
    outbox = Outbox("kernel", asyncio.Queue(), SelfMetrics())  # hub/queue.py, above kernel/
    assert upward_calls(Low(outbox.record)) == set()  # but the Sink protocol (core/model.py) is the kernel's own
    monkeypatch.setattr(High, "__module__", "gpuwarden.gpu.watch")
    assert upward_calls(Low(high.tell)) == set()  # the same layer


def test_every_exception_the_doc_names_says_why():
    named = named_in_the_doc()
    assert named, "the doc's table of calls up the layers is gone"
    assert all(len(why.split()) >= 5 for why in named.values()), "an exception without its reason"


def test_no_part_of_the_running_daemon_calls_up_but_the_ones_the_doc_names(tmp_path):
    daemon = daemon_in(tmp_path, exporter_port=free_port())  # the exporter's parts walked too

    async def scenario():
        async with running(daemon):
            await asyncio.sleep(0.2)  # the components built and polled once
            return walk(daemon)

    found, reached = asyncio.run(scenario())
    # the walk reached the parts, those the supervisor built in its tasks among them
    assert {"Hub", "Alerter", "Health", "Supervisor", "KernelWatch", "GpuWatch", "UeventWatch"} <= reached
    named = set(named_in_the_doc())
    assert sorted(found - named) == [], "a callable of a higher layer handed down (or name it in the doc, with why)"
    assert sorted(named - found) == [], "the doc names a call up that the code no longer makes"
