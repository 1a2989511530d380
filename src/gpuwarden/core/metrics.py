"""The registry of the daemon's own metrics: thread-safe values of the families declared in families.py,
which every layer counts into and the exporter serves."""

from __future__ import annotations

import math
import sys
import threading
from collections import defaultdict
from collections.abc import Callable

from gpuwarden import __version__
from gpuwarden.core import families as f
from gpuwarden.core.families import FAMILIES, Family


class SelfMetrics:
    """Thread-safe values of the declared families, keyed by label values."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple[str, ...], float]] = defaultdict(dict)
        self._live: dict[str, Callable[[], float]] = {}
        # what platform.python_version() reads, without loading platform (1.5 ms of every start)
        self.set(f.BUILD_INFO, 1, __version__, sys.version.split()[0])

    def inc(self, family: Family | str, *labels: str, by: float = 1) -> None:
        name = _declared(family, labels)
        if not math.isfinite(by):
            return  # NaN or Inf would poison the series for good
        with self._lock:
            series = self._values[name]
            series[labels] = series.get(labels, 0) + by

    def set(self, family: Family | str, value: float, *labels: str) -> None:
        name = _declared(family, labels)
        if not math.isfinite(value):
            return  # NaN or Inf from a source is not a reading: the last good value stays
        with self._lock:
            self._values[name][labels] = value

    def replace(self, family: Family | str, series: dict[tuple[str, ...], float]) -> None:
        """All series of one family at once: series of a GPU that went away disappear with it."""
        name = _declared(family, *series)
        with self._lock:
            self._values[name] = {labels: v for labels, v in series.items() if math.isfinite(v)}

    def live(self, family: Family | str, value: Callable[[], float]) -> None:
        """A gauge without labels computed whenever it is read (a scrape, a snapshot), from the reader's thread:
        for a value that must be current while the loop that would set it is blocked. `value` must not block."""
        name = _declared(family, ())
        with self._lock:
            self._live[name] = value

    def snapshot(self) -> dict[str, dict[tuple[str, ...], float]]:
        with self._lock:
            values = {name: dict(series) for name, series in self._values.items()}
            live = list(self._live.items())
        for name, value in live:
            if math.isfinite(reading := value()):
                values[name] = {(): reading}
        return values


def _declared(family: Family | str, *label_sets: tuple[str, ...]) -> str:
    """The family's name, when it is declared in families.py (a handle, or its name from a test or a tool) and
    every label set fits its labels; anything else is a bug that must not pass silently."""
    declared = FAMILIES.get(family.name if isinstance(family, Family) else family)
    if declared is None or (isinstance(family, Family) and family != declared):
        raise KeyError(f"undeclared metric family {family!r}: declare it in gpuwarden/core/families.py")
    for labels in label_sets:
        if len(labels) != len(declared.labels):
            raise ValueError(f"{declared.name} has labels {declared.labels}, not {labels!r}")
    return declared.name
