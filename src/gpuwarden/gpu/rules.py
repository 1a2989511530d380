"""Telemetry rules, pure: the latest samples of every GPU in, conditions that began or ended out.

A condition is raised once when it begins (or gets worse) and resolved once when it ends; `Change.event` is
None for a resolution.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from itertools import combinations

from gpuwarden.config.settings import GpuConfig
from gpuwarden.core.model import CONDITION, Event, GpuSample, Severity
from gpuwarden.core.plain import plain

W, C = Severity.WARNING, Severity.CRITICAL
SHUTDOWN_MARGIN = 3.0  # °C under the device's own shutdown temperature: critical while it can still be acted on


@plain
class Change:
    """A telemetry condition raised (with its event) or ended."""

    key: str  # the condition: "thermal:0000:03:00.0:junction"
    dedupe_key: str  # the alert key it resolves
    event: Event | None  # None: the condition ended
    message: str = ""


class TelemetryRules:
    """Which conditions are open is this object's state: the daemon keeps one across the GPU watch's restarts and
    reloads, and `resume` takes up those its store held open at a start, so that each one that began is told
    when it ends."""

    def __init__(self, config: GpuConfig) -> None:
        self._active: dict[str, tuple[Severity, str]] = {}  # condition key -> (severity, dedupe key)
        self._previous_power: dict[str, tuple[float, bool]] = {}  # GPU -> (peak watts, busy) at the last sample
        self.configure(config)

    def configure(self, config: GpuConfig) -> None:
        """A reload's [gpu] thresholds; what is open stays open, judged by them from the next round."""
        self.c = config
        # sensor -> the configured (warning, critical) °C (the GPU's own limits override them per sample)
        self._limits = {"edge": (config.edge_warn_celsius, config.edge_critical_celsius),
                        "junction": (config.junction_warn_celsius, config.junction_critical_celsius),
                        "mem": (config.mem_warn_celsius, config.mem_critical_celsius),
                        "gpu": (config.edge_warn_celsius, config.edge_critical_celsius)}

    def resume(self, keys: Iterable[str]) -> None:
        """Conditions a past run raised and never saw end: open here from now on, so that the next round tells
        their end, or says nothing while they last. Their severity is not stored: each is taken up as a warning
        (a critical one still critical is told once more, as critical)."""
        for key in keys:
            self._active.setdefault(key, (W, key))

    def evaluate(self, samples: dict[str, GpuSample], now: float) -> list[Change]:
        found: dict[str, Event] = {}
        for s in samples.values():
            if s.state != "ok":
                continue
            for key, event in self._per_gpu(s, now):
                found[key] = event
        for key, event in self._host(samples, now):
            found[key] = event
        return self._diff(found)

    def _per_gpu(self, s: GpuSample, now: float):
        c, limits = self.c, self._limits
        for sensor, value in s.temperatures.items():
            warn, crit = device_limits(limits.get(sensor, (None, None)), s.temperature_limits.get(sensor))
            if warn is not None and value >= warn:
                severity = C if value >= crit else W
                yield f"thermal:{s.gpu}:{sensor}", self._event("thermal", severity, s, now,
                                                               f"{sensor} temperature {value:.0f} °C",
                                                               {f"{sensor}_celsius": value})
        over_cap = s.power_cap_watts and s.power_watts is not None and \
            s.power_watts > s.power_cap_watts * c.power_over_cap_ratio
        if over_cap:
            yield f"power:{s.gpu}:cap", self._event("power", W, s, now, f"power {s.power_watts:.0f} W above its cap "
                                                    f"{s.power_cap_watts:.0f} W", {"power_watts": s.power_watts})
        spike_from, was_busy = self._previous_power.get(s.gpu, (None, False))
        peak = s.power_instant_watts or s.power_watts
        if peak is not None:
            # A step from idle to load is every job's start; a jump while already under load is the finding
            if spike_from is not None and was_busy and peak - spike_from >= c.power_spike_watts:
                yield f"power:{s.gpu}:spike", self._event("power", W, s, now,
                                                          f"power jumped {spike_from:.0f} -> {peak:.0f} W under load",
                                                          {"power_watts": peak})
            self._previous_power[s.gpu] = (peak, self._busy(s))
        hottest = max(s.temperatures.values(), default=None)
        stopped = s.fan_rpm == 0 or (s.fan_rpm is None and s.fan_pwm_ratio == 0)
        if stopped and s.fan_state != "passive" and hottest is not None and hottest >= c.fan_hot_celsius:
            yield f"fan:{s.gpu}", self._event("fan", C, s, now, f"fan stopped at {hottest:.0f} °C",
                                              {"fan_rpm": s.fan_rpm, "hottest_celsius": hottest})
        busy = self._busy(s)
        if busy and s.sclk_hz and s.sclk_max_hz and s.sclk_hz < s.sclk_max_hz * c.clock_low_ratio:
            yield f"clock:{s.gpu}:low", self._event(
                "clock", W, s, now, f"shader clock {s.sclk_hz / 1e6:.0f} MHz under load, max "
                f"{s.sclk_max_hz / 1e6:.0f} MHz", {"sclk_hz": s.sclk_hz, "busy_ratio": s.busy_ratio})
        slowing = [t for t in s.throttle if t in ("hw_slowdown", "hw_thermal", "sw_thermal", "hw_power_brake")]
        if slowing:
            yield f"clock:{s.gpu}:throttle", self._event("clock", W, s, now, f"throttling: {', '.join(slowing)}",
                                                         {"throttle": list(slowing)})
        below = (s.pcie_speed_gts and s.pcie_max_speed_gts and s.pcie_speed_gts < s.pcie_max_speed_gts) or \
                (s.pcie_width and s.pcie_max_width and s.pcie_width < s.pcie_max_width)
        if below and busy:  # idle GPUs train their link down to save power: only under load is it a finding
            yield f"pcie_link:{s.gpu}", self._event(
                "pcie_link", W, s, now, f"PCIe link at {s.pcie_speed_gts} GT/s x{s.pcie_width} under load, "
                f"capable of {s.pcie_max_speed_gts} GT/s x{s.pcie_max_width}",
                {"pcie_speed_gts": s.pcie_speed_gts, "pcie_width": s.pcie_width})

    def _host(self, samples: dict[str, GpuSample], now: float):
        c = self.c
        ok = [s for s in samples.values() if s.state == "ok"]
        total = sum(s.power_watts or 0 for s in ok)
        if c.psu_guard_watts and total > c.psu_guard_watts:
            yield "power:host:psu", Event("power", W, f"all GPUs together draw {total:.0f} W, above the PSU "
                                          f"guard {c.psu_guard_watts:.0f} W", now,
                                          evidence={"figures": {"total_watts": total}})
        models: dict[str, list[GpuSample]] = {}
        for s in ok:
            if s.model:
                models.setdefault(s.model, []).append(s)
        found = []  # told in the order of the pairs' GPUs, models mixed, as ever
        for group in models.values():
            if self._alike(group):  # no two of the model differ: no pair to compare (32 GPUs were 496 pairs)
                continue
            for a, b in combinations(sorted(group, key=lambda s: s.gpu), 2):
                if differences := self.differences(a, b):
                    found.append(((a.gpu, b.gpu), Event(
                        "config_asymmetry", W, f"{a.model} GPUs {a.gpu} and {b.gpu} differ: "
                        f"{'; '.join(differences)} (a setting written to both may have reached only one)", now,
                        evidence={"gpus": [a.gpu, b.gpu], "differences": differences})))
        for (a, b), event in sorted(found, key=lambda pair: pair[0]):
            yield f"config_asymmetry:{a}:{b}", event

    def differences(self, a: GpuSample, b: GpuSample) -> list[str]:
        """How two GPUs of one model differ in what should be set alike (none: they do not)."""
        c, out = self.c, []
        if a.power_cap_watts and b.power_cap_watts and \
                abs(a.power_cap_watts - b.power_cap_watts) > c.asymmetry_power_cap_watts:
            out.append(f"power caps {a.power_cap_watts:.0f} W vs {b.power_cap_watts:.0f} W")
        if a.overdrive != b.overdrive:
            out.append("overdrive settings differ")
        if self._busy(a) and self._busy(b) and a.sclk_hz and b.sclk_hz and \
                abs(a.sclk_hz - b.sclk_hz) / max(a.sclk_hz, b.sclk_hz) > c.asymmetry_clock_ratio:
            out.append(f"clocks under load {a.sclk_hz / 1e6:.0f} vs {b.sclk_hz / 1e6:.0f} MHz")
        return out

    def _busy(self, s: GpuSample) -> bool:
        return s.busy_ratio is not None and s.busy_ratio >= self.c.busy_ratio

    def _alike(self, group: list[GpuSample]) -> bool:
        """Whether no pair of the group differs (`differences`), told from the group's extremes: the
        widest gap between two caps is the largest less the smallest; and the relative gap (b - a) / b of two
        clocks a <= b is at most (max - min) / max, as (x - min) / x grows with x."""
        c = self.c
        caps = [s.power_cap_watts for s in group if s.power_cap_watts]
        if caps and max(caps) - min(caps) > c.asymmetry_power_cap_watts:
            return False
        first = group[0].overdrive
        if any(s.overdrive != first for s in group):
            return False
        clocks = [s.sclk_hz for s in group if s.sclk_hz and self._busy(s)]
        return not clocks or (max(clocks) - min(clocks)) / max(clocks) <= c.asymmetry_clock_ratio

    @staticmethod
    def _event(kind: str, severity: Severity, s: GpuSample, now: float, what: str, figures: dict) -> Event:
        return Event(kind, severity, f"{what} on {s.gpu}", now, gpu=s.gpu,
                     evidence={"figures": figures})

    def _diff(self, found: dict[str, Event]) -> list[Change]:
        changes = []
        for key, event in found.items():
            event = replace(event, evidence={**event.evidence, CONDITION: key})  # its own alert identity
            before = self._active.get(key)
            if before is None or event.severity > before[0]:
                changes.append(Change(key, event.dedupe_key, event))
            self._active[key] = (max(event.severity, before[0]) if before else event.severity, event.dedupe_key)
        for key in [k for k in self._active if k not in found]:
            _, dedupe_key = self._active.pop(key)
            changes.append(Change(key, dedupe_key, None, f"{key.split(':', 1)[0]} back to normal: {key}"))
        return changes


def device_limits(configured: tuple[float | None, float | None],
                  device: tuple[float | None, float | None] | None) -> tuple[float | None, float | None]:
    """(warning, critical) °C for one sensor: the card's own where it reports them (a warning where it slows
    itself down, critical SHUTDOWN_MARGIN under where it shuts down), the configured ones where it does not."""
    warn, crit = configured
    slowdown, shutdown = device or (None, None)
    warn = slowdown if slowdown is not None else warn
    crit = shutdown - SHUTDOWN_MARGIN if shutdown is not None else crit
    if warn is not None and crit is not None:
        warn = min(warn, crit)
    if crit is None and warn is not None:
        crit = warn
    return warn, crit
