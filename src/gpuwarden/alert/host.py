"""What an alert names besides its events, kept in the alert layer and told, never fetched from above: the GPUs
(the recorder and the inventory, below), the engines as the hub last heard them (hub/hub.py's Evidence tells
`engines` each time its views change) and the configuration (the daemon's `configure`, at a start and a reload)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from gpuwarden.alert.context import Context, Runs, gpu_indexes
from gpuwarden.config.settings import Config
from gpuwarden.core import policy
from gpuwarden.gpu.inventory import GpuInventory
from gpuwarden.gpu.recorder import FlightRecorder


class AlertContext:
    """What an alert names besides its events: each GPU's index and model, the engines on each GPU, how each
    configured engine runs (its unit, container, log), the kills its budget still counts."""

    def __init__(self, recorder: FlightRecorder, inventory: GpuInventory, config: Config) -> None:
        self.recorder, self.inventory = recorder, inventory
        self._models: dict[str, str] = {}  # GPU -> its model, as last read: a lost GPU keeps its name in alerts
        self.views: list[policy.EngineView] = []
        self.configure(config)

    def configure(self, config: Config) -> None:
        self.config = config

    def engines(self, views: Iterable[policy.EngineView]) -> None:
        """The engines as the hub holds them now (views replaced whole: the hub's own set)."""
        self.views = list(views)

    def __call__(self) -> Context:
        self._models.update((pci, s.model) for pci, s in self.recorder.latest().items() if s.model)
        gpus = gpu_indexes([*self.inventory.seen, *(g.pci for g in self.inventory.gpus)])
        views = self.views
        engines = {v.name: v.gpus for v in views}
        now, wall = time.monotonic(), time.time()
        kills = {v.name: tuple(wall - (now - t) for t in v.kills if now - t <= v.kill_budget_window) for v in views}
        config = self.config
        cache = config.cache
        held = 'on_crash_loop = "alert"' if cache.on_crash_loop == "alert" else \
            "[cache] dry_run = true" if cache.dry_run else None
        return Context(config.alerts.hostname, {pci: (i, self._models.get(pci)) for pci, i in gpus.items()},
                       engines, runs={e.name: Runs.of(e) for e in config.engine},
                       kills={name: k for name, k in kills.items() if k}, cache_dry_run=held)
