"""The one catalog of event kinds, a row each holding all that is known of the kind: the runbook its alert points
to, the words a title says of it, the node conditions it raises and resolves, whether it is a GPU fault, an
escalation of one or a crash loop to the policy, an action gpuwarden took or an outcome (what a report lists under
"actions"). Adding a kind is one row in CATALOG below, or, from a module of its own, one call:
`register("kind", Kind(...))` (and its runbook's text in alert/runbooks.py when it names a new one). Every set and
table derived from the rows (GPU_FAULT_KINDS..., conditions.RAISES) is a view read off the catalog when asked, so
a kind registered after import is whole everywhere. An event may name a runbook of its own in its evidence (a
kernel rule does; a wedged GPU that recovers by itself points to "reset"): that wins."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Set
from typing import TypeVar

from gpuwarden.core.model import ConditionKind as C
from gpuwarden.core.plain import plain

V = TypeVar("V")


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
    follow_up: bool = False  # an incident's alert follows up on it (every outcome's does too): the GPUs came back


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
    "gpus_back": Kind(None, resolves=(C.GPU_LOST,), follow_up=True),
    "gpus_changed": Kind("gpus_changed", resolves=(C.GPU_LOST,), follow_up=True),
}
_BUILT_IN = frozenset(CATALOG)


def register(kind: str, row: Kind) -> None:
    """A kind from a module of its own: one call, and every view below counts it."""
    if kind in CATALOG:
        raise ValueError(f"event kind {kind!r} is in the catalog already")
    CATALOG[kind] = row


def unregister(kind: str) -> None:
    """For a test's own kind: the built-in ones stay."""
    if kind in _BUILT_IN:
        raise ValueError(f"{kind!r} is a built-in event kind")
    del CATALOG[kind]


class Kinds(Set):
    """The kinds whose row passes `test`, read off the catalog at each question (a membership test is one dict
    look-up and one attribute): a kind registered after import is counted, as a frozenset made then would not."""

    __slots__ = ("_test",)

    def __init__(self, test: Callable[[Kind], bool]) -> None:
        self._test = test

    def __contains__(self, kind: object) -> bool:
        row = CATALOG.get(kind)  # type: ignore[call-overload]
        return row is not None and self._test(row)

    def __iter__(self) -> Iterator[str]:
        return (kind for kind, row in CATALOG.items() if self._test(row))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    @classmethod
    def _from_iterable(cls, kinds) -> frozenset[str]:  # what `|`, `&`, `-` make: a plain frozenset of that moment
        return frozenset(kinds)


class Table(Mapping[str, V]):
    """kind -> what `value` makes of its row, for the kinds where that is not empty; read off the catalog at each
    question, as Kinds is."""

    __slots__ = ("_value",)

    def __init__(self, value: Callable[[Kind], V]) -> None:
        self._value = value

    def __getitem__(self, kind: str) -> V:
        if (row := CATALOG.get(kind)) is None or not (value := self._value(row)):
            raise KeyError(kind)
        return value

    def __contains__(self, kind: object) -> bool:  # without Mapping's KeyError round trip (asked of every event)
        row = CATALOG.get(kind)  # type: ignore[call-overload]
        return row is not None and bool(self._value(row))

    def __iter__(self) -> Iterator[str]:
        return (kind for kind, row in CATALOG.items() if self._value(row))

    def __len__(self) -> int:
        return sum(1 for _ in self)


KINDS = Kinds(lambda row: True)
GPU_FAULT_KINDS = Kinds(lambda row: row.gpu_fault)
ACTION_KINDS = Kinds(lambda row: row.action)
OUTCOMES = Kinds(lambda row: row.outcome)
FOLLOW_UP_KINDS = Kinds(lambda row: row.outcome or row.follow_up)  # an incident's alert follows up on these
GPU_LOST_KINDS = Kinds(lambda row: row.condition == "gpu")
ENGINE_KINDS = Kinds(lambda row: row.condition == "engine")


def runbook(kind: str) -> str | None:
    """The kind's runbook key (an unknown kind, a user rule's own, has none)."""
    entry = CATALOG.get(kind)
    return entry.runbook if entry else None
ESCALATION_KINDS = Kinds(lambda row: row.escalation)
QUARANTINE_KINDS = Kinds(lambda row: row.quarantine)


def words(kind: str) -> str | None:
    """What broke, in a title's words (None: the kind has none; a title then says its message)."""
    entry = CATALOG.get(kind)
    return entry.words if entry else None
