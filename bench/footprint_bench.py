"""Footprint benchmark: what `gpuwarden run` costs before it does anything. Import time of the modules `run`
loads, the idle daemon's RSS, and the installed size of each runtime dependency (and what it is for), each
beside its alternative: a bare interpreter, and the figures before issue 27.

Timed as installed: with the modules' bytecode cached, as pip compiles it at install (here into a cache folder of
its own, PYTHONPYCACHEPREFIX). A checkout run with PYTHONDONTWRITEBYTECODE (this machine's setting) compiles
gpuwarden's own sources at every start instead: that figure is printed beside it.

The import figure is not one run: one run on this shared machine read anywhere from 130 to 230 ms. `--rounds`
rounds each time in turn the gpuwarden import, `import asyncio` alone (the floor: `run` cannot start without it),
the sources compiled at each start and, with `--against REV`, the same import of that commit's `src/` (taken with
`git archive`): each is reported as its median and spread (p10–p90), side by side under the same load.

    .venv/bin/python bench/footprint_bench.py [--rounds 21] [--runs 7] [--against REV] [--imports-only]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from figure import figure, load
from measure import free_port, rss_mb

# What each runtime dependency is for (a dependency pulled in by another is listed under it by the closure)
PURPOSE = {
    "apprise": "alert delivery to 100+ services (loaded only when a target is built)",
    "httpx": "https:// engine scrapes, canary completions (loaded on first use)",
    "psutil": "engine process trees, CPU and memory of engines",
    "nvidia-ml-py": "NVIDIA sensors through NVML (loaded only when the driver is there)",
    "pyudev": "GPU hot-plug and driver-bind uevents",
    "prometheus-client": "the exporter and the text-format parser",
    "pyahocorasick": "the kernel classifier's literal prefilter",
    "systemd-python": "journal catch-up and engine journal logs (optional extra `journal`)",
}


def installed_env(cache: Path) -> dict[str, str]:
    """The environment of an installed daemon: bytecode read from (and written to) `cache`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(cache)}


def import_ms(code: str, runs: int, env: dict[str, str] | None = None) -> float:
    """Median CPU ms of `code` in a fresh interpreter (`once`). A first run, untimed, fills the cache."""
    once(code, env)
    return statistics.median(once(code, env) for _ in range(runs))


def once(code: str, env: dict[str, str] | None = None) -> float:
    """CPU ms of `code` in a fresh interpreter, timed inside it (start-up excluded): CPU time, so that the shared
    machine's other work, which stretches wall time, counts less."""
    timed = f"import time; t = time.process_time(); {code}; print((time.process_time() - t) * 1000)"
    return float(subprocess.run([sys.executable, "-c", timed], capture_output=True, text=True, env=env,
                                check=True).stdout)


def interleaved(series: dict[str, tuple[str, dict[str, str] | None]], rounds: int) -> dict[str, list[float]]:
    """CPU ms of each (code, env) of `series`, `rounds` times, taking turns within each round: a busy spell on the
    machine weighs on all of them alike. A first round, not kept, fills the bytecode caches."""
    times: dict[str, list[float]] = {name: [] for name in series}
    for kept in [False] + [True] * rounds:
        for name, (code, env) in series.items():
            ms = once(code, env)
            if kept:
                times[name].append(ms)
    return times


def spread(values: list[float]) -> str:
    """Median and p10–p90 of `values`, as the table prints them."""
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return f"{statistics.median(values):.0f} ({deciles[0]:.0f}–{deciles[-1]:.0f})"


@contextlib.contextmanager
def source_of(rev: str) -> Iterator[str]:
    """A folder holding commit `rev`'s `src/`, for PYTHONPATH: it comes before the editable install."""
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(root), "archive", rev, "src"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        yield f"{tmp}/src"


def startup_ms(runs: int) -> float:
    """Median wall ms of a bare `python -c pass`: the interpreter's own start."""
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def idle_rss(tmp: Path, settle: float, env: dict[str, str]) -> tuple[float, int]:
    """RSS MB of `gpuwarden run` after `settle` s: exporter on, engine discovery on, an idle kernel log, no GPU;
    and how many engines it found to watch (on a shared machine, someone else's: their scrapes weigh in then)."""
    config = tmp / "gw.toml"
    (tmp / "empty.log").touch()
    port = free_port()
    config.write_text(f'[daemon]\nstate_dir = "{tmp}/state"\n[exporter]\nlisten = "127.0.0.1:{port}"\n'
                      f'[kernel]\nsource = "file"\nfile = "{tmp}/empty.log"\n'
                      f'[gpu]\nsysfs_root = "{tmp}/no-sys"\nnvml = false\n[guard]\nenabled = false\n')
    daemon = subprocess.Popen([sys.executable, "-m", "gpuwarden", "--config", str(config), "run"],
                              stderr=subprocess.DEVNULL, env=env)
    try:
        time.sleep(settle)
        if daemon.poll() is not None:
            raise RuntimeError(f"gpuwarden run exited {daemon.returncode}")
        rss = rss_mb(daemon.pid)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        return rss, metrics.count("\ngpuwarden_engine_up{")
    finally:
        daemon.terminate()
        daemon.wait(10)


def bare_rss() -> float:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        return rss_mb(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()


def closure(name: str, extras: tuple[str, ...] = ()) -> dict[str, str]:
    """The installed distributions `name` needs (with `extras`), itself excluded, by their canonical names, each
    with the distribution that pulled it in."""
    from packaging.requirements import Requirement

    seen: dict[str, str] = {}
    todo = [(name, extras)]
    while todo:
        dist_name, wanted = todo.pop()
        for text in metadata.requires(dist_name) or []:
            req = Requirement(text)
            env = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker and not any(req.marker.evaluate(e) for e in env):
                continue
            key = canonical(req.name)
            if key not in seen:
                seen[key] = canonical(dist_name)
                todo.append((req.name, tuple(req.extras)))
    return seen


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_mb(name: str) -> float:
    dist = metadata.distribution(name)
    total = 0
    for file in dist.files or []:
        path = Path(dist.locate_file(file))
        if path.is_file():
            total += path.stat().st_size
    return total / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=21, help="rounds of the interleaved import timings")
    parser.add_argument("--runs", type=int, default=7, help="runs of each other timing (median)")
    parser.add_argument("--against", metavar="REV", help="also time the import of this commit, in the same rounds")
    parser.add_argument("--imports-only", action="store_true", help="time the imports only (no daemon, no sizes)")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds: at least 2, for a spread")

    run = "import gpuwarden.cli.main, gpuwarden.daemon"
    with tempfile.TemporaryDirectory() as cache, contextlib.ExitStack() as stack:
        env = installed_env(Path(cache))
        series = {"run": (run, env), "asyncio": ("import asyncio", env), "compiled": (run, None)}
        if args.against:
            series["against"] = (run, {**env, "PYTHONPATH": stack.enter_context(source_of(args.against))})
        times = interleaved(series, args.rounds)
        run_imports = statistics.median(times["run"])
        bare = startup_ms(args.runs)
        print(f"## Import time of what `gpuwarden run` loads (CPU ms: median (p10–p90) of {args.rounds} rounds, "
              f"taking turns; {load()})\n")
        print("| what | CPU ms |\n|---|---:|")
        print(f"| import gpuwarden.cli.main + daemon, bytecode cached (as installed) | {spread(times['run'])} |")
        if args.against:
            print(f"| the same, of {args.against} | {spread(times['against'])} |")
        print(f"| import asyncio alone (the floor) | {spread(times['asyncio'])} |")
        print(f"| the same, gpuwarden's sources compiled at each start (a checkout under PYTHONDONTWRITEBYTECODE) "
              f"| {spread(times['compiled'])} |")
        for module, when in (("psutil", "at start"), ("prometheus_client", "with the first engine scraped: its parser"),
                             ("httpx", "with the first https:// engine, canary or Alertmanager target"),
                             ("apprise", "with the first apprise target")):
            print(f"| import {module} alone ({when}; median of {args.runs}) "
                  f"| {import_ms(f'import {module}', args.runs, env):.0f} |")
        print(f"| interpreter start (`python -c pass`, wall ms) | {bare:.0f} |\n")
        against = f"; {args.against} {spread(times['against'])} ms" if args.against else ""
        figure("import time of `gpuwarden run` (CPU)", run_imports, "ms",
               f"median (p10–p90) of {args.rounds} rounds {spread(times['run'])} ms{against}; import asyncio alone "
               f"{spread(times['asyncio'])} ms; sources compiled at each start "
               f"{statistics.median(times['compiled']):.0f} ms; interpreter start alone {bare:.0f} ms; before "
               f"issue 27: 340–430 ms ({load()})", "≤ 150 ms", run_imports <= 150)
        if args.imports_only:
            return

        # A first run, not measured, caches the bytecode of what the daemon loads once started (pyudev, the
        # exporter's server...): measured with it compiled at start, the daemon held 1 MB more than as installed.
        for _ in range(2):
            with tempfile.TemporaryDirectory() as tmp:
                rss, engines = idle_rss(Path(tmp), 8, env)
        imports_rss = float(subprocess.run(
            [sys.executable, "-c", f"{run}, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                                   "from measure import rss_mb; print(rss_mb())"],
            capture_output=True, text=True, check=True, env=env).stdout)
    bare_mb = bare_rss()
    print("## Idle RSS\n\n| what | MB |\n|---|---:|")
    print(f"| `gpuwarden run` idle (exporter, discovery, idle kernel log, no GPU), after 8 s | {rss:.1f} |")
    print(f"| its imports alone | {imports_rss:.1f} |\n| a bare interpreter | {bare_mb:.1f} |\n")
    found = f"; it found {engines} engine(s) of another user to watch" if engines else ""
    figure("idle RSS of `gpuwarden run`", rss, "MB",
           f"bare interpreter {bare_mb:.1f} MB, imports alone {imports_rss:.1f} MB{found}; before issue 27: 53–57 MB, "
           "50.0 MB at the last make bench", "≤ 35 MB", rss <= 35)

    deps = closure("gpuwarden")
    sizes = {name: installed_mb(name) for name in deps}
    why = {name: PURPOSE.get(name) or f"needed by {parent}" for name, parent in deps.items()}
    print("## Installed runtime dependencies (the closure of pyproject's `dependencies`, as installed)\n")
    print("| distribution | MB | for |\n|---|---:|---|")
    for name, mb in sorted(sizes.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {mb:.1f} | {why[name]} |")
    total = sum(sizes.values())
    optional = {n: installed_mb(n) for n in closure("gpuwarden", ("journal",)) if n not in sizes}
    for name, mb in optional.items():
        print(f"| {name} (optional extra `journal`, not counted) | {mb:.1f} | {PURPOSE.get(name, '')} |")
    print(f"| **total, required** | **{total:.1f}** | |\n")
    figure("installed runtime dependencies", total, "MB",
           "before issue 26/27: 209 MB (matplotlib and what it pulls in: 169 MB)", "≤ 50 MB", total <= 50)


if __name__ == "__main__":
    main()
