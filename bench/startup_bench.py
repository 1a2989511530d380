"""Start-up CPU against the size of the event store (issue 40): the real `gpuwarden run` started on a state
directory holding 10 k and 1 M stored events (alerted, a tenth of them in incidents), interleaved; the CPU the
process has used (utime + stime) when it logs "gpuwarden running". Python's own start and the imports are in
both; what grows with the store is the difference.

Timed as installed (footprint_bench.py's way): the modules' bytecode cached, as pip compiles it at install, here
in a cache folder of the bench's own (PYTHONPYCACHEPREFIX), filled by a start that is not measured. Under this
machine's PYTHONDONTWRITEBYTECODE a checkout compiles every gpuwarden module at every start: 400 ms, not ~250.

    .venv/bin/python bench/startup_bench.py [--rounds N] [--events N ...] [--against REV]

With `--against REV`, the same starts of the code of an earlier commit (its `src/` taken with `git archive`) are
timed in the same rounds, interleaved, on the same stores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "integration"), str(ROOT / "bench")]

from helpers import Daemon  # noqa: E402

from figure import figure, load  # noqa: E402
from gpuwarden.core.model import Event, Severity  # noqa: E402
from gpuwarden.store.sqlite import Store  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def filled(state: Path, events: int) -> None:
    """`events` stored events over the last 30 days, as a long-lived daemon leaves them, all alerted."""
    store = Store(state / "gpuwarden.db")
    now, batch = time.time(), 20_000
    for start in range(0, events, batch):
        store.add_events([Event("sq_intr", Severity.WARNING, "amdgpu ffff:fe:1f.7: sq_intr", now - 30 * 86400 *
                                (1 - i / events), gpu="ffff:fe:1f.7",
                                evidence={"incident": f"i{i // 1000}"} if i % 10 == 0 else {})
                          for i in range(start, min(events, start + batch))])
    store._db.execute("UPDATE events SET alerted = 1")
    store._db.commit()
    store.close()


def cpu_ms_at_running(tmp: Path, src: Path | None = None) -> float:
    """`src`: the `src/` folder of another tree to run (an earlier commit's)."""
    d = Daemon(tmp, env={"PYTHONPATH": str(src)} if src else None)
    before = d.stderr_path.stat().st_size if d.stderr_path.exists() else 0  # the log of the earlier rounds
    d.start()
    try:
        deadline = time.monotonic() + 60
        while "gpuwarden running" not in d.log()[before:]:
            if time.monotonic() > deadline or d.proc.poll() is not None:
                raise SystemExit(f"the daemon did not start: {d.log()[-2000:]}")
            time.sleep(0.005)
        fields = Path(f"/proc/{d.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 1000 / TICK
    finally:
        d.stop()


def child_ms(code: str) -> float:
    """CPU of a fresh interpreter that runs `code` and exits."""
    before = os.times()
    subprocess.run([sys.executable, "-c", code], check=True)
    after = os.times()
    return (after.children_user + after.children_system - before.children_user - before.children_system) * 1000


IMPORTS = "import gpuwarden.cli.main, gpuwarden.daemon"  # the floor every start pays
# and the kernel classifier `run` builds before it runs: its rules' expressions compiled
CLASSIFIER = (f"{IMPORTS}\nfrom gpuwarden.config.settings import Config\n"
              "from gpuwarden.kernel.watch import classifier_for\nclassifier_for(Config().kernel)")


def libraries() -> str:
    """Code that imports every module of Python's and of the libraries that `CLASSIFIER`'s imports load, and
    nothing of gpuwarden: the floor of the imports, which no change to gpuwarden's own modules can cut (a module
    marked absent, None in sys.modules, is not imported)."""
    listing = (f"{CLASSIFIER}\nimport sys\nprint(' '.join(name for name, module in sys.modules.items() if module "
               "is not None and name.split('.')[0] not in ('gpuwarden', '__main__')))")
    listed = subprocess.run([sys.executable, "-c", listing], capture_output=True, text=True, check=True).stdout.split()
    return f"import importlib\nfor m in {listed!r}:\n    try:\n        importlib.import_module(m)\n" \
           "    except Exception:\n        pass"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--events", type=int, nargs=2, default=[10_000, 1_000_000])
    parser.add_argument("--against", metavar="REV", help="also time the starts of this commit's code")
    args = parser.parse_args()
    small, large = args.events
    with tempfile.TemporaryDirectory() as root:
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # the daemons and the import runs inherit these
        os.environ["PYTHONPYCACHEPREFIX"] = str(Path(root) / "bytecode")
        old = None
        if args.against:
            old = Path(root) / "against"
            old.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.against, "src"], capture_output=True,
                                     check=True)
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
            old = old / "src"
        dirs = {}
        for n in (small, large):
            dirs[n] = Path(root) / str(n)
            (dirs[n] / "state").mkdir(parents=True)
            filled(dirs[n] / "state", n)
            print(f"stored {n:,} events ({(dirs[n] / 'state' / 'gpuwarden.db').stat().st_size >> 20} MB)", flush=True)
        cpu_ms_at_running(dirs[small])  # not measured: fills the bytecode cache
        if old:
            cpu_ms_at_running(dirs[small], old)
        times: dict[int, list[float]] = {small: [], large: []}
        before: list[float] = []  # the earlier commit's, at `large`
        imports, classifier, bare, floor = [], [], [], []
        floor_code = libraries()
        for _ in range(args.rounds):
            for n in (small, large):
                times[n].append(cpu_ms_at_running(dirs[n]))
            if old:
                before.append(cpu_ms_at_running(dirs[large], old))
            imports.append(child_ms(IMPORTS))
            classifier.append(child_ms(CLASSIFIER))
            bare.append(child_ms("pass"))
            floor.append(child_ms(floor_code))
    med = {n: statistics.median(v) for n, v in times.items()}
    print(json.dumps({str(n): v for n, v in times.items()} | {"imports": imports, "classifier": classifier,
                                                              "bare": bare, "floor": floor, "against": before}))
    if before:
        print(f"start-up CPU at {large:,} events, the code of {args.against}: {statistics.median(before):.0f} ms "
              f"({min(before):.0f}–{max(before):.0f}), this tree's {med[large]:.0f} ms, same rounds")
    imported, built = statistics.median(imports), statistics.median(classifier)
    figure(f"start-up CPU with {large:,} stored events (to 'gpuwarden running')", med[large], "ms",
           f"{small:,} events: {med[small]:.0f} ms; of it, a bare interpreter {statistics.median(bare):.0f} ms, the "
           f"imports {imported:.0f} ms, the kernel classifier's build {built - imported:.0f} ms; an interpreter "
           f"that imports only the Python and library modules these load (asyncio, sqlite3, ssl, psutil...) "
           f"{statistics.median(floor):.0f} ms (medians of "
           f"{args.rounds} interleaved, {min(times[large]):.0f}–{max(times[large]):.0f} at {large:,}"
           + (f"; the code of {args.against} {statistics.median(before):.0f} ms in the same rounds" if before else "")
           + f"; {load()})",
           "≤ 150 ms", med[large] <= 150)
    figure(f"start-up CPU the store adds: {large:,} events against {small:,}", med[large] - med[small], "ms",
           f"{med[large]:.0f} against {med[small]:.0f} ms (clock ticks of {1000 / TICK:.0f} ms)", "≤ 13 ms "
           "(issue 40: 150 ms at 1 M where 10 k took 137)", med[large] - med[small] <= 13)


if __name__ == "__main__":
    main()
