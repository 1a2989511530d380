"""`make test`'s wall time (issue 27: at most 30 minutes on a fresh machine, every real-engine test still run), in
the common figure format. It runs `make test` in this checkout (its output passes through), then prints the
steps' times tests/run.sh reported and one FIGURE line. Not part of `make bench`: it takes as long as make test.

    python3 bench/make_test_bench.py            # make test, as CI runs it
    python3 bench/make_test_bench.py -j1 ...    # anything after it goes to make
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEFORE_MIN, GOAL_MIN = 33.5, 30.0  # before: the wave before issue 27, with the engines cached


def main() -> int:
    started = time.monotonic()
    steps = []
    with subprocess.Popen(["make", "test", *sys.argv[1:]], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as make:
        for line in make.stdout:
            sys.stdout.write(line)
            if line.startswith("make test: ") and " s" in line and "log:" not in line:
                steps.append(line.strip())
    minutes = (time.monotonic() - started) / 60
    for step in steps:
        print(step)
    figure = {"name": "make test", "value": round(minutes, 1), "unit": "min",
              "alternative": f"before: {BEFORE_MIN} min", "goal": f"≤ {GOAL_MIN:.0f} min",
              "met": minutes <= GOAL_MIN and make.returncode == 0}
    if make.returncode:
        figure["note"] = f"make test failed ({make.returncode})"
    print("FIGURE " + json.dumps(figure, ensure_ascii=False))
    return make.returncode


if __name__ == "__main__":
    sys.exit(main())
