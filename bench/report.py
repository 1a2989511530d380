"""`make bench`: run the benches, pass their output through, collect their FIGURE lines (bench/figure.py) and
write the table of figures into docs/benchmarks.md and into README.md between the bench markers.

    .venv/bin/python bench/report.py [--only NAME ...]

Each bench runs under the time limit below; one that fails or times out is named in the table, the others go on.
Benches that need the real engines or the device machine are not run here (docs/benchmarks.md names them); those
that write their figures to a dated results file (RECORDED) are shown from it, with its date."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (script, arguments, time limit s): each finishes in a minute or two on the 2-core test machine
BENCHES = [
    ("footprint_bench.py", [], 180),
    ("kernel_bench.py", ["--lines", "300000", "--writes", "200"], 420),
    ("kernel_eval.py", ["--figures"], 120),
    ("engine_bench.py", ["--kills", "3"], 300),
    ("engines_bench.py", [], 300),
    ("telemetry_bench.py", ["--seconds", "30"], 480),
    ("target_bench.py", [], 180),
    ("look_bench.py", [], 300),
    ("fire_bench.py", ["--runs", "3"], 420),
    ("npd_bench.py", [], 180),
    ("durability_bench.py", [], 300),
    ("startup_bench.py", [], 420),
]
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
# Figures of benches too slow for `make bench` (real engines started and stalled: minutes each), as their last run
# wrote them with --write; shown with that run's date, never as this run's.
RECORDED = [("real_engines_bench.py", ROOT / "bench" / "recorded" / "real_engines.json"),
            ("restart_probe.py", ROOT / "bench" / "recorded" / "h200_restart.json")]  # the device machine's H200


def run(script: str, args: list[str], limit: float) -> tuple[list[dict], str | None]:
    """The figures `script` printed, and why it failed (None when it did not)."""
    figures = []
    proc = subprocess.Popen([sys.executable, "-u", str(ROOT / "bench" / script), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    timer = threading.Timer(limit, proc.kill)
    timer.start()
    try:
        for line in proc.stdout:
            print(line, end="", flush=True)
            if line.startswith("FIGURE "):
                figures.append({**json.loads(line[len("FIGURE "):]), "bench": script})
        proc.wait()
    finally:
        timer.cancel()
    if proc.returncode == -9:
        return figures, f"killed after {limit:.0f} s"
    return figures, f"exit {proc.returncode}" if proc.returncode else None


def recorded(script: str, path: Path) -> tuple[list[dict], str]:
    """The figures `script` wrote to `path`, each named with its date, and the table's note on where they came
    from (or that it never wrote any)."""
    if not path.exists():
        return [], f"Not measured: {script} (run by hand; its --write makes {path.name})."
    data = json.loads(path.read_text())
    figures = [{**f, "name": f"{f['name']} (recorded {data['when']})", "bench": script} for f in data["figures"]]
    return figures, (f"Recorded, not re-run: {script} {' '.join(data['argv'])}, {data['when']}, {data['load']} "
                     f"(real engines or the device machine: minutes a run).")


def value(fig: dict) -> str:
    v = fig["value"]
    text = f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return f"{text} {fig['unit']}"


def verdict(fig: dict) -> str:
    if not fig.get("goal"):
        return "no goal set"
    return {True: "met", False: "**missed**", None: "not judged"}[fig.get("met")]


def table(figures: list[dict], failures: list[str], when: str, notes: list[str] = ()) -> str:
    rows = ["| figure | value | alternative (same run) | goal | |", "|---|---:|---|---|---|"]
    rows += ["| " + " | ".join(cell.replace("|", "\\|") for cell in (
        f["name"], value(f), f.get("alternative", ""), f.get("goal") or "—", verdict(f))) + " |" for f in figures]
    lines = [f"\n`make bench`, {when}; bench/report.py writes this table."]
    lines += [f"Not measured: {failure}." for failure in failures]
    return "\n".join(rows + lines + list(notes)) + "\n"


def write_between(path: Path, text: str) -> None:
    old = path.read_text()
    if BEGIN not in old or END not in old:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} markers")
    head, rest = old.split(BEGIN, 1)
    path.write_text(f"{head}{BEGIN}\n{text}{END}{rest.split(END, 1)[1]}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="*", help="run only these benches (file names); the table is not written")
    args = parser.parse_args()
    chosen = [b for b in BENCHES if not args.only or b[0] in args.only]
    figures, failures = [], []
    loads = [os.getloadavg()[0]]
    for script, extra, limit in chosen:
        print(f"\n# {script}\n", flush=True)
        found, failed = run(script, extra, limit)
        figures += found
        if failed:
            failures.append(f"{script} ({failed})")
        loads.append(os.getloadavg()[0])
    notes = []
    for script, path in RECORDED if not args.only else ():
        found, note = recorded(script, path)
        figures += found
        notes.append(note)
    when = (f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores shared, load average "
            f"{min(loads):.1f}–{max(loads):.1f}")
    text = table(figures, failures, when, notes)
    print("\n" + text)
    if args.only:
        return 1 if failures else 0
    docs = ROOT / "docs" / "benchmarks.md"
    if not docs.exists():
        docs.write_text(f"# Benchmarks\n\n{BEGIN}\n{END}\n")
    write_between(docs, text)
    write_between(ROOT / "README.md", text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
