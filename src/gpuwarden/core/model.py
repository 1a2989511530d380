"""Types shared across the package: events, severities, PCI addresses."""

from __future__ import annotations

import enum
import re
from dataclasses import field, replace
from typing import Any, Protocol

from gpuwarden.core.families import Family
from gpuwarden.core.plain import compared, plain


class Severity(enum.IntEnum):
    INFO = 0
    WARNING = 1
    CRITICAL = 2

    def __str__(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        return cls[text.upper()]


HISTORY = "history"  # evidence key of an event that is history, not live
LOGGED_AT = "logged_at"  # evidence key of history: when its line was logged (wall clock), where it can be told
CONDITION = "condition"  # evidence key of a telemetry condition's own identity (one GPU can have several)
CROWD = "crowd"  # evidence key: the user whose discovered servers are alerted as one ("discovered engines of u")


class ConditionKind(enum.StrEnum):
    """What can be wrong now (conditions.py says which events raise and resolve each)."""

    ENGINE_STALLED = "engine_stalled"
    ENGINE_UNRESPONSIVE = "engine_unresponsive"
    ENGINE_DOWN = "engine_down"
    ENGINE_RESTARTING = "engine_restarting"
    GPU_LOST = "gpu_lost"  # survives a daemon restart (loaded from the store) until the GPU is back
    GPU_DEGRADED = "gpu_degraded"  # a telemetry condition (its own subject: one GPU can have several)
    STORE_UNWRITABLE = "store_unwritable"  # gpuwarden's own: events wait in memory


@compared(order=True)
class ConditionKey:
    """A condition's identity: its kind and its subject (an engine's name, a GPU's PCI address, a telemetry
    condition's id, or "host"). Made by conditions.stalled(engine), conditions.lost(gpu)..., never by hand."""

    kind: ConditionKind
    subject: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.subject}"


@compared
class Event:
    """Something gpuwarden noticed. `time` is wall-clock seconds since the epoch."""

    kind: str
    severity: Severity
    message: str
    time: float
    gpu: str | None = None
    engine: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    count: int = 1

    @property
    def live(self) -> bool:
        """False for history: a line logged before gpuwarden started (look-back, catch-up). History is alerted
        and reported, and never acts. Kept in the evidence, so it survives the store."""
        return HISTORY not in self.evidence

    def as_history(self, logged_at: float | None = None) -> Event:
        """`logged_at`: when its line was logged, where it can be told (the event's `time` is when it was read)."""
        evidence = {**self.evidence, HISTORY: "logged before gpuwarden started"}
        if logged_at is not None:
            evidence[LOGGED_AT] = logged_at
        return replace(self, evidence=evidence)

    @property
    def dedupe_key(self) -> str:
        """Stable across restarts: what the event is about, not when. A telemetry condition is its own key
        (a power spike that ends must not resolve the over-cap condition of the same GPU)."""
        if condition := self.evidence.get(CONDITION):
            return condition
        if crowd := self.evidence.get(CROWD):  # one user's servers: the second one's stall is a repeat, not news
            return f"{self.kind}:{crowd}"
        subject = self.gpu or self.engine or "host"
        xid = self.evidence.get("xid")
        return f"{self.kind}:{subject}" + (f":xid{xid}" if xid is not None else "")


_PCI = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?$")


def normalize_pci(address: str) -> str:
    """`00000000:3B:00.0`, `0000:01:00` (NVRM short form) and `3b:00.0` all become `0000:3b:00.0`.

    Domains above 0xffff (Intel VMD) keep their extra digits.
    """
    m = _PCI.match(address.strip())
    if not m:
        raise ValueError(f"not a PCI address: {address!r}")
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn or '0')}"


@plain
class GpuSample:
    """One reading of one GPU. None: not supported or not readable now (`problems` says which)."""

    gpu: str
    vendor: str
    model: str | None
    time: float
    state: str = "ok"  # ok | not_readable (busy, suspended, resetting) | gone (off the bus, removed)
    power_watts: float | None = None
    power_source: str | None = None  # which sensor gave power_watts (power1_average, power1_input, nvml)
    power_instant_watts: float | None = None
    power_cap_watts: float | None = None
    power_cap_max_watts: float | None = None
    temperatures: dict[str, float] = field(default_factory=dict)  # sensor -> °C (edge, junction, mem, gpu)
    # sensor -> (slowdown, shutdown) °C as the device reports them (NVML thresholds; amdgpu temp*_crit, _emergency)
    temperature_limits: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    fan_rpm: float | None = None
    fan_pwm_ratio: float | None = None
    fan_state: str | None = None  # "passive" for cards without a fan
    sclk_hz: float | None = None
    mclk_hz: float | None = None
    sclk_max_hz: float | None = None
    voltage_mv: float | None = None
    busy_ratio: float | None = None
    vram_total_bytes: float | None = None
    vram_used_bytes: float | None = None  # what processes use: the driver's own reserve is not counted
    vram_reserved_bytes: float | None = None  # the driver's reserve (NVML's v2 memory info)
    vram_visible_total_bytes: float | None = None
    pcie_speed_gts: float | None = None
    pcie_width: int | None = None
    pcie_max_speed_gts: float | None = None
    pcie_max_width: int | None = None
    perf_level: str | None = None
    overdrive: dict[str, dict[str, float]] = field(default_factory=dict)  # pp_od_clk_voltage sections
    throttle: tuple[str, ...] = ()
    problems: dict[str, str] = field(default_factory=dict)  # file or call -> "busy", "gone", ...


class Sink(Protocol):
    """The one interface every component reports through: its own `reports.Outbox`, which puts what it said in one
    step on the one queue the hub drains, and writes its metrics to its own handles. Components only emit, and
    never wait for an answer: batches of events (with the cursor of the source that read them; `record` returns
    the outbox's own references for them), a storm's final count (by that reference), a condition that ended,
    the engines watched (each poll its own engine; `whole`: these are all of them, the others are gone),
    counts and gauges. A condition a component sees end without an event (an engine answers again) is resolved
    by its key (conditions.py); `cures`: the event kinds that observation cures (None: any).
    What is stored, alerted and done about them is the hub's and the policy's business."""

    def record(self, events: list[Event], cursor: tuple[str, str] | None = None) -> list[tuple[str, int]]: ...
    def set_count(self, ref: tuple[str, int], event: Event) -> None: ...
    def resolve(self, key: ConditionKey, message: str, cures: frozenset[str] | None = None) -> None: ...
    def count(self, family: Family, *labels: str, by: float = 1) -> None: ...
    def metric(self, family: Family, value: float, *labels: str) -> None: ...
    def replace_series(self, family: Family, series: dict[tuple[str, ...], float]) -> None: ...
    def polled(self, source: str) -> None: ...
    def kernel_lines(self, now: float, texts: list[str]) -> None: ...
    def engines(self, views: list, samples: dict[str, dict], whole: bool) -> None: ...


class NullSink:
    """For one-off readings (`gpuwarden status`, benchmarks): events and metrics go nowhere."""

    def record(self, events: list[Event], cursor: tuple[str, str] | None = None) -> list[tuple[str, int]]:
        return [("null", 0)] * len(events)

    def set_count(self, ref: tuple[str, int], event: Event) -> None:
        pass

    def resolve(self, key: ConditionKey, message: str, cures: frozenset[str] | None = None) -> None:
        pass

    def count(self, family: Family, *labels: str, by: float = 1) -> None:
        pass

    def metric(self, family: Family, value: float, *labels: str) -> None:
        pass

    def replace_series(self, family: Family, series: dict[tuple[str, ...], float]) -> None:
        pass

    def polled(self, source: str) -> None:
        pass

    def kernel_lines(self, now: float, texts: list[str]) -> None:
        pass

    def engines(self, views: list, samples: dict[str, dict], whole: bool) -> None:
        pass
