"""The running object graph is one-way: a real Daemon is built and started in this process, and the gpuwarden
objects it holds are walked (gc.get_referents) for a reference cycle.

What counts as the graph: every object whose class is gpuwarden's own is a node. An edge A -> B is a reference
from A to B, directly or through plain containers and callables: dicts, lists, tuples, sets, deques, bound
methods (their `__self__`), closures (their cells), functools.partial (its function and arguments). The walk
does not go into asyncio's and threading's objects (tasks, futures, queues, events, locks, threads, the loop:
their frames and callbacks are the runtime's, not the wiring), nor classes, modules and a function's globals.
A cycle among the nodes means some part can reach back to one that holds it: wiring that is not one-way."""

import asyncio
import collections
import functools
import gc
import threading
import types

from helpers import free_port, http_get
from inprocess import daemon_in, running

_CONTAINERS = (dict, list, tuple, set, frozenset, collections.deque)
_SKIPPED = (type, types.ModuleType, asyncio.AbstractEventLoop, asyncio.Future, asyncio.Queue, asyncio.Event,
            asyncio.Lock, asyncio.Condition, asyncio.Semaphore, asyncio.TaskGroup, asyncio.Handle, threading.Thread,
            type(threading.Lock()), type(threading.RLock()), threading.Condition, threading.Event)


def _ours(obj) -> bool:
    return type(obj).__module__.startswith("gpuwarden") and not isinstance(obj, type)


def _through(obj) -> list:
    """What a plain container or callable leads to (one step)."""
    if isinstance(obj, types.MethodType):
        return [obj.__self__]
    if isinstance(obj, types.FunctionType):
        return [content for cell in obj.__closure__ or () if (content := _content(cell)) is not None]
    if isinstance(obj, functools.partial):
        return [obj.func, *obj.args, *obj.keywords.values()]
    if isinstance(obj, _CONTAINERS):
        return gc.get_referents(obj)
    return []


def _content(cell):
    try:
        return cell.cell_contents
    except ValueError:  # a cell not filled yet
        return None


def graph_of(root) -> tuple[dict[int, set[int]], dict[int, object]]:
    """Node ids -> the node ids each refers to; node ids -> the nodes (kept alive for the walk)."""
    nodes, edges, stack = {id(root): root}, {}, [root]
    while stack:
        node = stack.pop()
        targets: dict[int, object] = {}
        seen = {id(node)}
        todo = gc.get_referents(node)
        while todo:
            obj = todo.pop()
            if id(obj) in seen or isinstance(obj, _SKIPPED):
                continue
            seen.add(id(obj))
            if _ours(obj):
                targets[id(obj)] = obj
            else:
                todo += _through(obj)
        edges[id(node)] = set(targets)
        for key, obj in targets.items():
            if key not in nodes:
                nodes[key] = obj
                stack.append(obj)
    return edges, nodes


def cycles(edges: dict[int, set[int]]) -> list[list[int]]:
    """One cycle for each strongly connected group of more than one node (or a node that refers to itself)."""
    index, low, on, stack, found, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in edges.get(v, ()):
                found.append(group)

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def described(groups, nodes) -> list[list[str]]:
    return [sorted(type(nodes[i]).__name__ for i in group) for group in groups]


def test_the_walk_sees_a_cycle():
    class Part:
        def run(self) -> None:
            pass
    Part.__module__ = "gpuwarden.test"
    a, b = Part(), Part()
    a.other, b.back = [b], a.run  # through a list, and back through a bound method
    edges, nodes = graph_of(a)
    assert described(cycles(edges), nodes) == [["Part", "Part"]]
    b.back = None
    assert cycles(graph_of(a)[0]) == []


def test_the_running_daemon_s_object_graph_has_no_cycle(tmp_path):
    port = free_port()
    daemon = daemon_in(tmp_path, exporter_port=port)
    walked = {}

    async def scenario():
        async with running(daemon):
            await asyncio.sleep(0.2)  # the components built and polled once
            # the status page served once (its snapshot is gathered on this loop, from a thread)
            pages: list[str] = []
            reader = threading.Thread(target=lambda: pages.append(http_get(f"http://127.0.0.1:{port}/status.json")))
            reader.start()
            while reader.is_alive():
                await asyncio.sleep(0.05)
            assert '"summary"' in pages[0]
            edges, nodes = graph_of(daemon)
            walked["nodes"] = {type(n).__name__ for n in nodes.values()}
            walked["cycles"] = described(cycles(edges), nodes)

    asyncio.run(scenario())
    assert {"Daemon", "Hub", "Actuator", "EngineWatch", "Alerter", "Outbox", "QueuedStore", "Supervisor",
            "Health", "Exporter", "Status"} <= walked["nodes"]  # the walk reached the parts
    assert walked["cycles"] == []
