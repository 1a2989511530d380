"""The one catalog of event kinds, a row each holding all that is known of the kind: the runbook its alert points
to, the words a title says of it, the node conditions it raises and resolves, whether it is a GPU fault, an
escalation of one or a crash loop to the policy, an action gpuwarden took or an outcome (what a report lists under
"actions"). Adding a kind is one row here (and its runbook's text in alert/runbooks.py when it names a new one).
An event may name a runbook of its own in its evidence (a kernel rule does; a wedged GPU that recovers by itself
points to "reset"): that wins."""

from __future__ import annotations

from gpuwarden.core.model import ConditionKind as C
from gpuwarden.core.plain import plain


@plain
class Kind:
    """What an event kind means to the policy, the alerts and the node conditions."""

    runbook: str | None  # a key of alert.runbooks.RUNBOOKS; None: no runbook
    gpu_fault: bool = False  # an engine on that GPU is killed at once (an Xid counts when critical: policy)
    action: bool = False  # says what gpuwarden itself did
    outcome: bool = False  # what gpuwarden did, or a kill it was not allowed to do
    condition: str | None = None  # the node condition it bears on (npd-check): "gpu", a critical one loses the
    # GPU until a reboot (config/prometheus/gpuwarden-rules.yml's GpuwardenGpuLost too); "engine", an engine's
    # trouble or its fix
    words: str | None = None  # what broke, in a title's words, after the GPU's or the engine's name
    raises: tuple[C, ...] = ()  # the conditions it raises on its subject (and a "gpu" one GPU_LOST: conditions.py)
    resolves: tuple[C, ...] = ()  # the conditions it ends on its subject
    escalation: bool = False  # the GPU got worse (reset, lost): the policy's suspect engines on it are killed
    quarantine: bool = False  # a crash loop: the policy moves the engine's poisoned compile caches aside


CATALOG: dict[str, Kind] = {
    # the kernel log (a kernel rule names its own runbook; these are the defaults)
    "sq_intr": Kind("gpu_fault", gpu_fault=True, words="shader fault (SQ interrupt)"),
    "ring_timeout": Kind("gpu_fault", gpu_fault=True, words="ring timeout"),
    "page_fault": Kind("gpu_fault", gpu_fault=True, words="page fault"),
    "gpu_reset": Kind("reset", words="reset by the driver", escalation=True),
    "reset_failed": Kind("device_lost", condition="gpu", words="reset failed", escalation=True),
    "device_lost": Kind("device_lost", condition="gpu", words="fell off the bus", escalation=True),
    "smu_error": Kind("gpu_fault", words="SMU error"),
    "ras_error": Kind("ras", words="uncorrectable memory error"),
    "pcie_aer": Kind("aer", words="PCIe error"),
    "xid": Kind("xid", condition="gpu"),
    "gsp_error": Kind("gsp", words="firmware (GSP) error"),
    "kernel_oops": Kind("oops"),
    "kmsg_overrun": Kind("kmsg"),
    # GPU telemetry, the PCI bus and uevents
    "gpu_unresponsive": Kind("device_lost", condition="gpu", words="not answering"),
    "gpu_missing": Kind("device_lost", condition="gpu", words="missing"),
    "thermal": Kind("thermal"),
    "power": Kind("power"),
    "fan": Kind("fan"),
    "clock": Kind("clock"),
    "pcie_link": Kind("pcie_link"),
    "config_asymmetry": Kind("asymmetry"),
    "unbind_attempt": Kind("device_lost"),
    "device_removed": Kind("device_lost"),
    "gpu_wedged": Kind("device_lost", condition="gpu", words="wedged", escalation=True),
    # engines
    "engine_stall": Kind("stall", condition="engine", words="stalled", raises=(C.ENGINE_STALLED,)),
    "engine_unresponsive": Kind("stall", condition="engine", words="not answering",
                                raises=(C.ENGINE_UNRESPONSIVE,)),
    "engine_exited": Kind("crash_loop", words="exited", raises=(C.ENGINE_DOWN,),
                          resolves=(C.ENGINE_STALLED, C.ENGINE_UNRESPONSIVE)),
    "engine_crash_loop": Kind("crash_loop", condition="engine", words="in a crash loop", raises=(C.ENGINE_DOWN,),
                              quarantine=True),
    # a configured engine silent for its restart_timeout since gpuwarden began to watch it or since its last answer
    "engine_not_answering": Kind("not_answering", condition="engine", words="not answering",
                                 raises=(C.ENGINE_DOWN,)),
    # it cannot accept a connection (a full accept queue, no descriptor left) while it idles: never killed for it
    "engine_saturated": Kind(None),
    # a fault with no owner on the engine's GPU: gpuwarden watches it closely (threshold at its floor, a canary)
    "engine_suspect": Kind("gpu_fault", words="suspect"),
    "log_refused": Kind("refused_file"),  # an engine's log file that is not a regular file of its user
    # the canary was refused (401, 403) or found no route or model (404): a configuration problem, said once
    "canary_misconfigured": Kind(None),
    "discovery_flood": Kind(None),  # more engine-like servers than max_discovered: one alert for the crowd
    # the socket on an engine's address is held by a process that is not the engine's: never read nor asked
    "engine_port_taken": Kind(None, condition="engine"),
    # what gpuwarden did, or was not allowed to do
    "engine_killed": Kind(None, action=True, outcome=True, condition="engine", raises=(C.ENGINE_DOWN,),
                          resolves=(C.ENGINE_STALLED, C.ENGINE_UNRESPONSIVE)),
    "cache_poisoned": Kind("cache_poisoned", action=True, outcome=True),
    "kill_refused": Kind("kill_refused", outcome=True, condition="engine"),
    # a decided kill that could not run (no process found, its look late, a signal refused): said, tried again
    "kill_not_done": Kind("kill_not_done", outcome=True, condition="engine"),
    "engine_restarting": Kind(None, action=True, outcome=True, condition="engine",
                              raises=(C.ENGINE_RESTARTING,)),  # asked its supervisor
    # its tokens moved, or a real completion returned
    "engine_back": Kind(None, outcome=True, condition="engine",
                        resolves=(C.ENGINE_STALLED, C.ENGINE_UNRESPONSIVE, C.ENGINE_DOWN, C.ENGINE_RESTARTING)),
    "engine_restart_failed": Kind("restart_failed", outcome=True, condition="engine", raises=(C.ENGINE_DOWN,),
                                  resolves=(C.ENGINE_RESTARTING,)),
    # its supervisor did not start it when asked (no answer, a failed start job): asked again until restart_timeout
    "engine_restart_retrying": Kind("restart_retrying", outcome=True, condition="engine"),
    # gpuwarden itself
    "guard_lost": Kind(None),
    "watchdog_error": Kind("daemon"),
    "clock_step": Kind(None),  # the wall clock stepped (health.py): times before and after it do not compare
    "store_unwritable": Kind("store", raises=(C.STORE_UNWRITABLE,)),
    "exporter_port_taken": Kind(None),  # another user serves on the exporter's port: Prometheus scrapes it
    # the confirmation after a reboot that followed a lost GPU (recovery.py)
    "gpus_back": Kind(None, resolves=(C.GPU_LOST,)),
    "gpus_changed": Kind("gpus_changed", resolves=(C.GPU_LOST,)),
}

KINDS = frozenset(CATALOG)
GPU_FAULT_KINDS = frozenset(k for k, v in CATALOG.items() if v.gpu_fault)
ACTION_KINDS = frozenset(k for k, v in CATALOG.items() if v.action)
OUTCOMES = frozenset(k for k, v in CATALOG.items() if v.outcome)
GPU_LOST_KINDS = frozenset(k for k, v in CATALOG.items() if v.condition == "gpu")
ENGINE_KINDS = frozenset(k for k, v in CATALOG.items() if v.condition == "engine")


def runbook(kind: str) -> str | None:
    """The kind's runbook key (an unknown kind, a user rule's own, has none)."""
    entry = CATALOG.get(kind)
    return entry.runbook if entry else None
ESCALATION_KINDS = frozenset(k for k, v in CATALOG.items() if v.escalation)
QUARANTINE_KINDS = frozenset(k for k, v in CATALOG.items() if v.quarantine)


def words(kind: str) -> str | None:
    """What broke, in a title's words (None: the kind has none; a title then says its message)."""
    entry = CATALOG.get(kind)
    return entry.words if entry else None
