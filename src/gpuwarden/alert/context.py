"""What an alert knows besides its events (the host, its GPUs and engines, the reader's clock), and the plain
questions the title, the body and the steps ask of an incident's events."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from pathlib import Path

from gpuwarden.alert.runbooks import OFF_THE_BUS_XIDS
from gpuwarden.alert.storm import FOLLOW_UP_KINDS
from gpuwarden.core.eventkinds import GPU_LOST_KINDS
from gpuwarden.core.model import Event
from gpuwarden.core.plain import plain


@plain
class Runs:
    """How an engine runs, as configured: what a person restarts and where its own log is (None: not known)."""

    unit: str | None = None  # the systemd unit that runs it (target kind "unit", or log_unit)
    container: str | None = None  # its Docker container (target kind "docker", or log_container)
    log_file: Path | None = None

    @classmethod
    def of(cls, engine) -> Runs:
        """From an engine's configuration (config.EngineConfig)."""
        target = engine.target
        return cls(target.unit if target.kind == "unit" else engine.log_unit,
                   target.container if target.kind == "docker" else engine.log_container, engine.log_file)

    def restart(self) -> str | None:
        """The command that starts it again."""
        if self.unit:
            return f"`systemctl restart {self.unit}`"
        return f"`docker restart {self.container}`" if self.container else None

    def logs(self, since: float | None = None) -> str | None:
        """The command that shows its own log, from `since` (epoch seconds) where given: in UTC, which both
        commands read whatever the reader's zone."""
        at = datetime.fromtimestamp(since, UTC) if since is not None else None
        if self.unit:
            return f"`journalctl -u {self.unit}" + (f" --since '{at:%Y-%m-%d %H:%M:%S} UTC'`" if at else "`")
        if self.container:
            return f"`docker logs {f'--since {at:%Y-%m-%dT%H:%M:%S}Z ' if at else ''}{self.container}`"
        return f"`less {self.log_file}`" if self.log_file else None


@dataclass(frozen=True, eq=False, repr=False)
class Context:
    """What the daemon knows that the events do not say: the host, its GPUs and engines, the reader's clock."""

    host: str
    gpus: Mapping[str, tuple[int, str | None]] = field(default_factory=dict)  # PCI address -> (index, model)
    engines: Mapping[str, frozenset[str] | None] = field(default_factory=dict)  # engine -> its GPUs (None: any)
    tz: tzinfo | None = None  # the reader's local time zone; None: the machine's
    # engine -> how it runs, from its configuration: the page names the real unit, container and log file
    runs: Mapping[str, Runs] = field(default_factory=dict)
    # engine -> the times (epoch seconds) of its real kills still counted in its kill budget, oldest first
    kills: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    cache_dry_run: str | None = None  # the setting that keeps a crash loop's caches in place, as written

    def gpu(self, pci: str | None) -> str:
        if pci is None:
            return "a GPU"
        if pci not in self.gpus:
            return f"GPU {pci}"
        index, model = self.gpus[pci]
        return f"GPU {index} ({pci}{', ' + model if model else ''})"

    def runs_of(self, engine: str | None) -> Runs:
        return self.runs.get(engine or "", _UNKNOWN)

    def engines_on(self, pci: str) -> list[str]:
        """The engines known to run on the GPU."""
        return sorted(name for name, gpus in self.engines.items() if gpus is not None and pci in gpus)

    def engines_maybe_on(self, pci: str) -> list[str]:
        """The engines whose GPUs are unknown: they may be on any (the policy counts them too)."""
        return sorted(name for name, gpus in self.engines.items() if gpus is None)


_UNKNOWN = Runs()


def gpu_indexes(pcis) -> dict[str, int]:
    """Each GPU's number as the pages and the status page name it ("GPU 0"): its place among every GPU seen
    since start, by PCI address (a lost GPU keeps its number)."""
    return {pci: i for i, pci in enumerate(sorted(set(pcis)))}


def first(events: list[Event], *kinds: str) -> Event | None:
    return next((e for e in events if e.kind in kinds), None)


def first_fault(events: list[Event]) -> Event | None:
    return next((e for e in events if e.kind not in FOLLOW_UP_KINDS), None)


def is_lost(e: Event) -> bool:
    """A GPU gone until a reboot (an Xid counts only when it says the GPU fell off the bus)."""
    return (e.kind in GPU_LOST_KINDS and e.kind != "xid") or e.evidence.get("xid") in OFF_THE_BUS_XIDS
