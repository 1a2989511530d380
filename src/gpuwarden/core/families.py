"""The daemon's own Prometheus metric families, each declared once as a typed handle.

Components write through a handle (`sink.count(families.KERNEL_LINES, source)`), never a name string: a typo is
an AttributeError at once, not a series that silently never appears. `FAMILIES` keeps declaration order,
which is the order of the exposition; exporter.SelfMetrics refuses anything that is not declared here.
"""

from __future__ import annotations

from typing import Literal, NamedTuple


class Family(NamedTuple):
    name: str
    kind: Literal["counter", "gauge"]
    doc: str
    labels: tuple[str, ...] = ()


FAMILIES: dict[str, Family] = {}


def _declare(name: str, kind: Literal["counter", "gauge"], doc: str, *labels: str) -> Family:
    family = FAMILIES[name] = Family(name, kind, doc, labels)
    return family


def _gpu(name: str, doc: str, *extra: str) -> Family:
    return _declare(name, "gauge", doc, "gpu", "vendor", "model", *extra)


BUILD_INFO = _declare("gpuwarden_build_info", "gauge", "Version of the running gpuwarden.", "version", "python")
COMPONENT_UP = _declare("gpuwarden_component_up", "gauge",
                        "1 while the component runs (or finished its work), 0 while it waits to restart.", "component")
COMPONENT_RESTARTS = _declare("gpuwarden_component_restarts_total", "counter",
                              "Restarts of a component after it failed.", "component")
EVENTS = _declare("gpuwarden_events_total", "counter", "Live events recorded, by kind and severity.", "kind",
                  "severity")
HISTORY_EVENTS = _declare("gpuwarden_history_events_total", "counter",
                          "Events from lines logged before gpuwarden started (look-back, catch-up), by kind and "
                          "severity: reported, never acted on.", "kind", "severity")
LOOP_LAG = _declare("gpuwarden_loop_lag_seconds", "gauge",
                    "How late the event loop is: the last check, or the one due now while a block goes on.")
LOOP_BLOCKED = _declare("gpuwarden_loop_blocked_total", "counter",
                        "Times the event loop was blocked beyond loop_lag_warn.")
SOURCE_LAST_SUCCESS = _declare("gpuwarden_source_last_success_timestamp_seconds", "gauge",
                               "When a source last delivered or polled successfully (Unix time).", "source")
SOURCE_UP = _declare("gpuwarden_source_up", "gauge",
                     "1 while a source (kernel, uevents) can be read, 0 while it cannot (retried every minute).",
                     "source")
KERNEL_LINES = _declare("gpuwarden_kernel_lines_total", "counter", "Kernel log lines read, by source.", "source")
KERNEL_LINES_MALFORMED = _declare("gpuwarden_kernel_lines_malformed_total", "counter",
                                  "Kernel log lines that could not be parsed.", "source")
ALERTS_SENT = _declare("gpuwarden_alerts_sent_total", "counter", "Alerts delivered, by target and severity.",
                       "target", "severity")
ALERTS_FAILED = _declare("gpuwarden_alerts_failed_total", "counter", "Failed delivery attempts (each is retried).",
                         "target", "severity")
ALERTS_UNDELIVERABLE = _declare("gpuwarden_alerts_undeliverable_total", "counter",
                                "Alerts given up on after give_up_after.", "target", "severity")
ALERTS_PENDING = _declare("gpuwarden_alerts_pending", "gauge", "Alerts waiting in the outbox.", "target", "severity")
ALERTS_SUPPRESSED = _declare("gpuwarden_alerts_suppressed_total", "counter",
                             "Events not sent because their key was cooling down.", "severity")
CONDITION = _declare("gpuwarden_condition", "gauge",
                      "1 while a condition is open (engine_stalled, engine_down, gpu_lost...; docs/conditions.md); "
                      "the series goes away when it is resolved. gpu_lost survives a gpuwarden restart.",
                      "condition", "subject", "gpu", "engine")
INCIDENT = _declare("gpuwarden_incident", "gauge",
                     "1 while an incident is open (one cause: its fault, the kill, the restart); the series goes away "
                     "when it closes. `id` is its folder under state_dir/incidents.", "id", "kind", "gpu", "engine")
ENGINE_UP = _declare("gpuwarden_engine_up", "gauge", "1 when the engine's last /metrics scrape succeeded.", "engine")
ENGINE_REQUESTS_RUNNING = _declare("gpuwarden_engine_requests_running", "gauge", "Requests the engine runs now.",
                                   "engine")
ENGINE_REQUESTS_WAITING = _declare("gpuwarden_engine_requests_waiting", "gauge", "Requests queued in the engine.",
                                   "engine")
ENGINE_GENERATED_TOKENS = _declare("gpuwarden_engine_generated_tokens_total", "counter",
                                   "The engine's generated-token counter.", "engine")
ENGINE_STALLED = _declare("gpuwarden_engine_stalled", "gauge", "1 while the engine is stalled.", "engine")
ENGINE_STALL_THRESHOLD = _declare("gpuwarden_engine_stall_threshold_seconds", "gauge",
                                  "How long without progress counts as a stall.", "engine")
ENGINE_CPU = _declare("gpuwarden_engine_cpu_ratio", "gauge",
                      "CPU of the engine's busiest process, as a share of one core (1 = one core).", "engine")
ENGINE_SCRAPE_FAILURES = _declare("gpuwarden_engine_scrape_failures_total", "counter",
                                  "Failed /metrics scrapes, by reason.", "engine", "reason")
ENGINE_KILLS = _declare("gpuwarden_engine_kills_total", "counter", "Times gpuwarden killed the engine.", "engine")
ENGINE_CANARIES = _declare("gpuwarden_engine_canaries_total", "counter", "One-token canary completions, by outcome.",
                           "engine", "outcome")
GUARD_PATHS = _declare("gpuwarden_guard_paths", "gauge", "Sysfs files under the recovery guard, intact or missing.",
                       "state")
UEVENTS = _declare("gpuwarden_uevents_total", "counter", "Kernel uevents seen, by subsystem and action.",
                   "subsystem", "action")
GPU_POWER = _gpu("gpuwarden_gpu_power_watts",
                 "GPU power (amdgpu power1_average, else power1_input; NVML 1 s average).")
GPU_POWER_CAP = _gpu("gpuwarden_gpu_power_cap_watts", "GPU power cap.")
GPU_TEMPERATURE = _gpu("gpuwarden_gpu_temperature_celsius", "GPU temperature by sensor (edge, junction, mem; gpu).",
                       "sensor")
GPU_FAN = _gpu("gpuwarden_gpu_fan_rpm", "GPU fan speed.")
GPU_BUSY = _gpu("gpuwarden_gpu_busy_ratio", "GPU busy share, 0 to 1.")
GPU_VOLTAGE = _gpu("gpuwarden_gpu_voltage_volts", "GPU core voltage.")
GPU_CLOCK = _gpu("gpuwarden_gpu_clock_hz", "GPU clocks (sclk, mclk).", "clock")
GPU_VRAM = _gpu("gpuwarden_gpu_vram_bytes", "GPU memory (total; used, without the driver's reserve; reserved; "
                "visible_total).", "kind")
GPU_THROTTLE = _gpu("gpuwarden_gpu_throttle", "1 while the GPU slows its clocks for this reason (NVML's clock event "
                    "reasons), else 0.", "reason")
GPU_TEMPERATURE_LIMIT = _gpu("gpuwarden_gpu_temperature_limit_celsius", "The temperature at which the GPU slows "
                             "itself down or shuts down, as it reports it, by sensor.", "sensor", "limit")
GPU_PCIE_SPEED = _gpu("gpuwarden_gpu_pcie_link_speed_transfers_per_second",
                      "PCIe link speed in transfers per second (current, max; 16 GT/s is 1.6e10).", "link")
GPU_PCIE_WIDTH = _gpu("gpuwarden_gpu_pcie_link_width", "PCIe link width in lanes (current, max).", "link")
GPU_READER_UP = _gpu("gpuwarden_gpu_reader_up", "1 when the GPU's last read finished in time.")
GPU_READ_DURATION = _declare("gpuwarden_gpu_read_duration_seconds", "gauge", "How long the GPU's last read took.",
                             "gpu")
GPU_READ_ERRORS = _declare("gpuwarden_gpu_read_errors_total", "counter",
                           "GPU reads that failed or timed out, by state.", "gpu", "state")
KMSG_OVERRUNS = _declare("gpuwarden_kmsg_overruns_total", "counter",
                         "Times /dev/kmsg overwrote records before they were read.")
STORE_WRITABLE = _declare("gpuwarden_store_writable", "gauge",
                          "1 while the store takes writes, 0 while they wait in memory.")
STORE_PENDING_WRITES = _declare("gpuwarden_store_pending_writes", "gauge", "Writes waiting in memory for the store.")
STORE_DROPPED_WRITES = _declare("gpuwarden_store_dropped_writes_total", "counter",
                                "Writes dropped since start because too many waited.")
