"""The one line every bench prints per headline figure, which `make bench` (bench/report.py) collects:

    FIGURE {"name": ..., "value": number, "unit": ..., "alternative": "...", "goal": "...", "met": true|false|null}

`met` is None where the figure has no goal."""

from __future__ import annotations

import json
import os


def figure(name: str, value: float, unit: str, alternative: str, goal: str | None, met: bool | None) -> None:
    print("FIGURE " + json.dumps({"name": name, "value": round(value, 3), "unit": unit, "alternative": alternative,
                                  "goal": goal or "", "met": met if goal else None}, ensure_ascii=False),
          flush=True)


def load() -> str:
    """The machine's load as the figures were taken (the machine is shared): 1-minute load average per core."""
    return f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
