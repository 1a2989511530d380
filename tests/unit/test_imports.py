"""The import rule, checked on every module's imports (parsed, not run): between folders, imports go one way,
down these layers, and never in a cycle. A folder may import others of its own layer, without a cycle.

    entry points    cli (the command, its man page and completion, install, doctor, npd-check), __main__
    wiring          daemon (the one loose module besides the package's entry points)
    the event path  hub (the queue, the hub that drains it, its incidents component, the daemon's health, the state
                    snapshot)
    effects         act (the actuator, killer, guard, quarantine), alert, web (the exporter and status page)
    components      kernel, gpu, engine: they only emit, through core/model.Sink; they never act nor alert
    configuration   config (the TOML file and the web config), enginekinds (one module per engine kind), store
                    (the SQLite store, the incident bundles)
    foundation      core (the vocabulary, pure: model, event kinds, conditions, incidents, policy, metrics
                    registry), runtime (pools, supervision, ticks, sd_notify, logging, reloads, sockets, loop lag)

`gpuwarden/__init__.py` (the version) counts as "gpuwarden". Each folder is one node, whole: config checks
kernel rule and runbook names through core/registry.py, which the domain fills, so it imports no domain package.
"""

import ast
from pathlib import Path

import gpuwarden

SRC = Path(gpuwarden.__file__).parent
LAYERS = [
    {"gpuwarden", "core", "runtime"},
    {"config", "enginekinds", "store"},
    {"kernel", "gpu", "engine"},
    {"act", "alert", "web"},
    {"hub"},
    {"daemon"},
    {"cli", "__main__"},
]
LOOSE = {"__init__.py", "__main__.py", "daemon.py"}  # every other module lives in its layer's folder
LAYER = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def package_of(module: str) -> str:
    """gpuwarden.engine.watch -> engine; gpuwarden.core.policy -> core; gpuwarden -> gpuwarden."""
    parts = module.split(".")
    if len(parts) == 1:
        return "gpuwarden"
    name = parts[1]
    return name if (SRC / name).is_dir() or (SRC / f"{name}.py").exists() else "gpuwarden"


def graph() -> dict[str, dict[str, str]]:
    """package -> {imported package: the first file:line that imports it}."""
    edges: dict[str, dict[str, str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        me = package_of("gpuwarden." + ".".join(rel.with_suffix("").parts).removesuffix(".__init__"))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                base = node.module
                modules = [f"{base}.{a.name}" for a in node.names] if base == "gpuwarden" else [base]
            else:
                assert not isinstance(node, ast.ImportFrom) or node.level == 0, f"{rel}: relative import"
                continue
            for module in modules:
                if module == "gpuwarden" or module.startswith("gpuwarden."):
                    target = package_of(module)
                    if target != me:
                        edges.setdefault(me, {}).setdefault(target, f"{rel}:{node.lineno}")
    return edges


def cycles(edges: dict[str, dict[str, str]]) -> list[list[str]]:
    """Every cycle found by a depth-first walk (each as the path that closes it)."""
    found, done = [], set()

    def walk(node: str, path: list[str]) -> None:
        if node in path:
            found.append([*path[path.index(node):], node])
            return
        if node in done:
            return
        for target in edges.get(node, {}):
            walk(target, [*path, node])
        done.add(node)

    for start in edges:
        walk(start, [])
    return found


def test_the_scan_sees_the_known_edges():
    edges = graph()
    assert {"core", "engine"} <= set(edges["act"])  # the actuator kills through the engine watch
    assert "act" not in edges["engine"]  # the cycle engine <-> act is broken: engines never kill


def test_no_cycle_between_packages():
    edges = graph()
    assert cycles(edges) == []
    assert cycles({"a": {"b": ""}, "b": {"c": ""}, "c": {"a": ""}}) == [["a", "b", "c", "a"]]  # the check sees one


def test_no_loose_module_but_the_wiring_and_the_entry_points():
    assert {path.name for path in SRC.glob("*.py")} == LOOSE


def test_no_cycle_between_folders():
    """At folder level, no node split out: each folder of src/gpuwarden is one node and each top-level module its
    own. A cycle here is a cycle between the rooms of the house, whatever module-level exceptions would allow."""
    edges = graph()
    nodes = set(edges) | {t for targets in edges.values() for t in targets}
    assert all(n == "gpuwarden" or (SRC / n).is_dir() or (SRC / f"{n}.py").is_file() for n in nodes), nodes
    assert cycles(edges) == []
    edges["config"]["kernel"] = "config/settings.py"  # config importing the rule catalog again: the check must see it
    assert any({"config", "kernel"} <= set(cycle) for cycle in cycles(edges))


def test_every_package_has_a_layer_and_imports_only_its_own_or_lower_layers():
    edges = graph()
    packages = set(edges) | {t for targets in edges.values() for t in targets}
    assert packages - set(LAYER) == set(), "a new package: give it its layer in LAYERS (and docs/architecture.md)"
    upward = {f"{source} -> {target} ({where})" for source, targets in edges.items()
              for target, where in targets.items() if LAYER[target] > LAYER[source]}
    assert upward == set()


def test_only_model_defines_a_sink_and_the_daemon_handles_no_event():
    """Components see the hub through model.Sink alone (the actuator sees the engines through its narrow port,
    Engines; discovery hands the engines it found through Watched; the hub tells the engine watch the events about
    its engines through Learns, a kill's outcome among them; a component reports its state to the registry through
    Reports); daemon.py wires, it never records, alerts or acts."""
    protocols = {f"{path.relative_to(SRC)}: {node.name}" for path in sorted(SRC.rglob("*.py"))
                 for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)
                 and any(getattr(base, "id", None) == "Protocol" for base in node.bases)}
    assert protocols == {"core/model.py: Sink", "runtime/supervise.py: Component", "act/actuator.py: Engines",
                         "engine/finder.py: Watched", "alert/channel.py: Channel", "hub/hub.py: Learns",
                         "core/registry.py: Reports"}
    daemon = ast.parse((SRC / "daemon.py").read_text())
    methods = {node.name for node in ast.walk(daemon) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    assert methods.isdisjoint({"record", "resolve", "set_count", "count", "metric", "_act", "kernel_lines"})
    made = {node.func.id for node in ast.walk(daemon) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert "Event" not in made  # the daemon makes no event of its own


def test_the_daemon_wires_without_lambdas_or_later_assignments():
    """daemon.py builds each part with what it uses: no lambda stands between two parts, and nothing is assigned
    into a part afterwards (`self.part.attr = ...`); a part that changes on a reload has its own `configure`.
    The running graph itself is walked for cycles in tests/integration/test_object_graph.py."""
    daemon = ast.parse((SRC / "daemon.py").read_text())
    assert [node.lineno for node in ast.walk(daemon) if isinstance(node, ast.Lambda)] == []
    targets = [t for node in ast.walk(daemon) if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign)
               for t in (node.targets if isinstance(node, ast.Assign) else [node.target])]
    into_parts = [ast.unparse(t) for target in targets for t in ast.walk(target)
                  if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Attribute)]
    assert into_parts == []
