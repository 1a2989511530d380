"""The daemon's state as one plain, JSON-ready dict: what the status page, /status.json and `gpuwarden status`
show. Built on the event loop, where that state lives (the exporter's threads ask for it through daemon.Status), from
what the components already hold: nothing is read from disk or from a GPU here.

Times are wall-clock seconds; an engine's monotonic times are turned into wall-clock ones once, here.
"""

from __future__ import annotations

import os
import time
from typing import Any

from gpuwarden import __version__
from gpuwarden.alert.context import gpu_indexes
from gpuwarden.core import families as f
from gpuwarden.gpu.rules import device_limits
from gpuwarden.store import bundles as report


def gather(daemon: Any, now: float | None = None) -> dict[str, Any]:
    """`daemon`: a running daemon's parts, daemon.Status (duck-typed: this module sits beside it, not above it)."""
    now = time.time() if now is None else now
    metrics = daemon.metrics.snapshot()
    states = daemon.registry.states()  # what each component says of itself (core/registry.py)
    return {
        "host": daemon.config.alerts.hostname,
        "version": __version__,
        "pid": os.getpid(),
        "time": now,
        "started": now - (time.monotonic() - daemon.started),
        "summary": daemon.summary(),
        "loop_lag_seconds": round(daemon.health.loop_lag(), 3),
        "store_error": daemon.store_health.error,
        "sources": _sources(states, metrics),
        "components": _components(metrics),
        "gpus": _gpus(daemon),
        "engines": states.get("engines", {}).get("engines", []),
        "incidents": [{**i, "picture": f"/incidents/{i['id']}/{report.PICTURE}"} for i in open_incidents(daemon.hub)],
        **_alerts(getattr(daemon.hub, "alerter", None)),
    }


def _alerts(alerter: Any) -> dict[str, Any]:
    """What the alerter holds of the recent past (alert/alerter.py's Recent): the last events, each incident's
    pages (what they told to do, whether the all-clear went out), each target's deliveries."""
    if alerter is None:
        return {"recent_events": [], "paged": {}, "targets": []}
    return alerter.recent.snapshot([t.name for t in alerter.targets], alerter.pending())


def open_incidents(hub: Any) -> list[dict[str, Any]]:
    """The incidents open now, with their decisions: the hub's incidents are the one place that knows."""
    return [incident.row() for incident in hub.incidents.open.values()]


def _sources(states: dict[str, dict[str, Any]], metrics: dict) -> list[dict[str, Any]]:
    """Each source that says whether it is up; its last success is polled under its own name or, for the kernel
    log, under each reader it used (kernel_kmsg, kernel_journal, kernel_file): the latest of those. The kernel and
    uevent watches say their own state (`up`, `detail`) through the registry; one not built yet is not started."""
    up, last = metrics.get(f.SOURCE_UP.name, {}), metrics.get(f.SOURCE_LAST_SUCCESS.name, {})
    kernel = states.get("kernel")
    details = {name: states[name]["detail"] if name in states else "not started" for name in ("kernel", "uevents")}
    rows = []
    for name in sorted({labels[0] for labels in up} | {"kernel"}):
        ok = up.get((name,))
        if name == "kernel" and kernel is not None:
            ok = 1.0 if kernel["up"] else 0.0
        polled = [t for (label,), t in last.items() if label == name or label.startswith(f"{name}_")]
        rows.append({"name": name, "up": None if ok is None else ok == 1, "last_success": max(polled, default=None),
                     "detail": details.get(name, "")})
    return rows


def _components(metrics: dict) -> list[dict[str, Any]]:
    restarts = metrics.get(f.COMPONENT_RESTARTS.name, {})
    return [{"name": labels[0], "up": value == 1, "restarts": int(restarts.get(labels, 0))}
            for labels, value in sorted(metrics.get(f.COMPONENT_UP.name, {}).items())]


def _gpus(daemon: Any) -> list[dict[str, Any]]:
    latest, cfg = daemon.recorder.latest(), daemon.config.gpu
    limits_c = {"edge": (cfg.edge_warn_celsius, cfg.edge_critical_celsius),
                "junction": (cfg.junction_warn_celsius, cfg.junction_critical_celsius),
                "mem": (cfg.mem_warn_celsius, cfg.mem_critical_celsius)}
    # numbered as the pages number them (daemon.AlertContext): every GPU seen since start, by PCI address
    index = gpu_indexes([*daemon.inventory.seen, *(g.pci for g in daemon.inventory.gpus)])
    rows = []
    for gpu in daemon.inventory.gpus:
        s = latest.get(gpu.pci)
        row: dict[str, Any] = {"gpu": gpu.pci, "index": index.get(gpu.pci), "vendor": gpu.vendor,
                               "driver": gpu.driver, "model": None,
                               "state": "no reading" if gpu.driver else "no driver", "read_at": None,
                               "sensors": {}, "limits": {}, "problems": {}, "throttle": []}
        if s is not None:
            row.update(model=s.model, state=s.state, read_at=s.time, problems=dict(s.problems),
                       throttle=list(s.throttle))
            row["sensors"] = _present({
                "power_watts": s.power_watts, "fan_rpm": s.fan_rpm, "fan": s.fan_state, "sclk_hz": s.sclk_hz,
                "mclk_hz": s.mclk_hz, "busy_ratio": s.busy_ratio, "voltage_volts": s.voltage_mv and s.voltage_mv / 1e3,
                "vram_used_bytes": s.vram_used_bytes, "pcie_speed_gts": s.pcie_speed_gts, "pcie_width": s.pcie_width,
                **{f"temperature_{k}_celsius": v for k, v in s.temperatures.items()}})
            row["limits"] = _present({
                "power_cap_watts": s.power_cap_watts, "power_cap_max_watts": s.power_cap_max_watts,
                "sclk_max_hz": s.sclk_max_hz, "vram_total_bytes": s.vram_total_bytes,
                "pcie_max_speed_gts": s.pcie_max_speed_gts, "pcie_max_width": s.pcie_max_width,
                # the limits the GPU watch judges by: the card's own where it reports them (an NVIDIA core's
                # slowdown and shutdown), else the configured ones
                **{f"temperature_{k}_{level}_celsius": limit for k in s.temperatures
                   for level, limit in zip(("warn", "critical"), device_limits(
                       limits_c.get(k, (None, None)), s.temperature_limits.get(k)), strict=True)
                   if limit is not None}})
        rows.append(row)
    return rows


def _present(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}
