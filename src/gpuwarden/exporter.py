"""Prometheus exporter: the daemon's self-metrics, served from a consistent in-memory snapshot.

Components write through `SelfMetrics`; a scrape copies everything under one lock and renders the copy,
so concurrent scrapes (prometheus_client runs one thread per request) never see a half-updated state.
"""

from __future__ import annotations

import math
import platform
import threading
from collections import defaultdict
from typing import NamedTuple

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gpuwarden import __version__


class Family(NamedTuple):
    kind: str  # "counter" or "gauge"
    doc: str
    labels: tuple[str, ...] = ()


FAMILIES: dict[str, Family] = {
    "gpuwarden_build_info": Family("gauge", "Version of the running gpuwarden.", ("version", "python")),
    "gpuwarden_component_up": Family("gauge", "1 while the component runs, 0 while it waits to restart.",
                                     ("component",)),
    "gpuwarden_component_restarts_total": Family("counter", "Restarts of a component after it failed.",
                                                 ("component",)),
    "gpuwarden_events_total": Family("counter", "Events recorded, by kind and severity.", ("kind", "severity")),
    "gpuwarden_loop_lag_seconds": Family(
        "gauge", "How late the event loop is: the last check, or the one due now while a block goes on."),
    "gpuwarden_loop_blocked_total": Family("counter", "Times the event loop was blocked beyond loop_lag_warn."),
    "gpuwarden_source_last_success_timestamp_seconds": Family(
        "gauge", "When a source last delivered or polled successfully (Unix time).", ("source",)),
    "gpuwarden_source_up": Family("gauge", "1 while a source (kernel, uevents) can be read, 0 while it cannot "
                                  "(retried every minute).", ("source",)),
    "gpuwarden_kernel_lines_total": Family("counter", "Kernel log lines read, by source.", ("source",)),
    "gpuwarden_kernel_lines_malformed_total": Family("counter", "Kernel log lines that could not be parsed.",
                                                     ("source",)),
    "gpuwarden_alerts_sent_total": Family("counter", "Alerts delivered, by target and severity.",
                                          ("target", "severity")),
    "gpuwarden_alerts_failed_total": Family("counter", "Failed delivery attempts (each is retried).",
                                            ("target", "severity")),
    "gpuwarden_alerts_undeliverable_total": Family("counter", "Alerts given up on after give_up_after.",
                                                   ("target", "severity")),
    "gpuwarden_alerts_pending": Family("gauge", "Alerts waiting in the outbox.", ("target", "severity")),
    "gpuwarden_alerts_suppressed_total": Family("counter", "Events not sent because their key was cooling down.",
                                                ("severity",)),
    "gpuwarden_engine_up": Family("gauge", "1 when the engine's last /metrics scrape succeeded.", ("engine",)),
    "gpuwarden_engine_requests_running": Family("gauge", "Requests the engine runs now.", ("engine",)),
    "gpuwarden_engine_requests_waiting": Family("gauge", "Requests queued in the engine.", ("engine",)),
    "gpuwarden_engine_generated_tokens_total": Family("counter", "The engine's generated-token counter.",
                                                      ("engine",)),
    "gpuwarden_engine_stalled": Family("gauge", "1 while the engine is stalled.", ("engine",)),
    "gpuwarden_engine_stall_threshold_seconds": Family("gauge", "How long without progress counts as a stall.",
                                                       ("engine",)),
    "gpuwarden_engine_cpu_percent": Family("gauge", "CPU of the engine's busiest process (100 = one core).",
                                           ("engine",)),
    "gpuwarden_engine_scrape_failures_total": Family("counter", "Failed /metrics scrapes, by reason.",
                                                     ("engine", "reason")),
    "gpuwarden_engine_kills_total": Family("counter", "Times gpuwarden killed the engine.", ("engine",)),
    "gpuwarden_engine_canaries_total": Family("counter", "One-token canary completions, by outcome.",
                                              ("engine", "outcome")),
    "gpuwarden_guard_paths": Family("gauge", "Sysfs files under the recovery guard, intact or missing.",
                                    ("state",)),
    "gpuwarden_uevents_total": Family("counter", "Kernel uevents seen, by subsystem and action.",
                                      ("subsystem", "action")),
    **{name: Family("gauge", doc, ("gpu", "vendor", "model", *extra)) for name, doc, extra in (
        ("gpuwarden_gpu_power_watts", "GPU power (amdgpu power1_average, else power1_input; NVML 1 s average).", ()),
        ("gpuwarden_gpu_power_cap_watts", "GPU power cap.", ()),
        ("gpuwarden_gpu_temperature_celsius", "GPU temperature by sensor (edge, junction, mem; gpu).", ("sensor",)),
        ("gpuwarden_gpu_fan_rpm", "GPU fan speed.", ()),
        ("gpuwarden_gpu_busy_ratio", "GPU busy share, 0 to 1.", ()),
        ("gpuwarden_gpu_voltage_volts", "GPU core voltage.", ()),
        ("gpuwarden_gpu_clock_hz", "GPU clocks (sclk, mclk).", ("clock",)),
        ("gpuwarden_gpu_vram_bytes", "GPU memory (total, used, visible_total).", ("kind",)),
        ("gpuwarden_gpu_pcie_link_speed_gigatransfers", "PCIe link speed in GT/s (current, max).", ("link",)),
        ("gpuwarden_gpu_pcie_link_width", "PCIe link width in lanes (current, max).", ("link",)),
        ("gpuwarden_gpu_reader_up", "1 when the GPU's last read finished in time.", ()),
    )},
    "gpuwarden_gpu_read_duration_seconds": Family("gauge", "How long the GPU's last read took.", ("gpu",)),
    "gpuwarden_gpu_read_errors_total": Family("counter", "GPU reads that failed or timed out, by state.",
                                              ("gpu", "state")),
    "gpuwarden_kmsg_overruns_total": Family("counter", "Times /dev/kmsg overwrote records before they were read."),
    "gpuwarden_store_writable": Family("gauge", "1 while the store takes writes, 0 while they wait in memory."),
    "gpuwarden_store_pending_writes": Family("gauge", "Writes waiting in memory for the store."),
    "gpuwarden_store_dropped_writes": Family("gauge", "Writes dropped since start because too many waited."),
}


class SelfMetrics:
    """Thread-safe values for FAMILIES, keyed by label values."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple[str, ...], float]] = defaultdict(dict)
        self.set("gpuwarden_build_info", 1, __version__, platform.python_version())

    def inc(self, name: str, *labels: str, by: float = 1) -> None:
        if not math.isfinite(by):
            return  # NaN or Inf would poison the series for good
        with self._lock:
            series = self._values[name]
            series[labels] = series.get(labels, 0) + by

    def set(self, name: str, value: float, *labels: str) -> None:
        if not math.isfinite(value):
            return  # NaN or Inf from a source is not a reading: the last good value stays
        with self._lock:
            self._values[name][labels] = value

    def replace(self, name: str, series: dict[tuple[str, ...], float]) -> None:
        """All series of one family at once: series of a GPU that went away disappear with it."""
        with self._lock:
            self._values[name] = {labels: v for labels, v in series.items() if math.isfinite(v)}

    def snapshot(self) -> dict[str, dict[tuple[str, ...], float]]:
        with self._lock:
            return {name: dict(series) for name, series in self._values.items()}


class _Collector:
    def __init__(self, metrics: SelfMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> list:
        return []  # collect() is cheap, but there is no need to run it at registration

    def collect(self):
        snapshot = self._metrics.snapshot()
        for name in [n for n in FAMILIES if n in snapshot]:  # declaration order, not the order of first use
            series, family = snapshot[name], FAMILIES[name]
            cls = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
            metric = cls(name.removesuffix("_total"), family.doc, labels=family.labels)
            for labels, value in sorted(series.items()):
                metric.add_metric(labels, value)
            yield metric


class Exporter:
    def __init__(self, metrics: SelfMetrics, listen: str, port: int) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(metrics))
        self._listen, self._port = listen, port
        self._server = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.server_port if self._server else self._port

    def start(self) -> None:
        self._server, self._thread = start_http_server(self._port, addr=self._listen, registry=self.registry)

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None
