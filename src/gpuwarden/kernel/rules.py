"""The kernel-line rule catalog, as data.

Each rule: a name, a regular expression searched in the message text (the part after any timestamp and
`host kernel:` prefix), the event kind and severity, the vendor, what the line means, and a runbook key.
The first rule that matches a line wins, so specific rules stand before general ones. Config rules
(`[[kernel.rule]]`) are tried before these.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwarden.model import Severity

I, W, C = Severity.INFO, Severity.WARNING, Severity.CRITICAL


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    pattern: str
    kind: str
    severity: Severity
    vendor: str
    meaning: str
    runbook: str
    hints: tuple[str, ...] = ()  # literals of which every match contains one; () means "try every line"


def _r(name, pattern, kind, severity, vendor, meaning, runbook, hints) -> Rule:
    return Rule(name, pattern, kind, severity, vendor, meaning, runbook, tuple(hints.split("|")))


RULES: tuple[Rule, ...] = (
    # --- NVIDIA -------------------------------------------------------------------------------------
    _r("nv_xid", r"NVRM: Xid \(PCI:[0-9a-fA-F:.]+\): (?P<xid>\d+)", "xid", W, "nvidia",
       "NVIDIA Xid error", "xid",
       "NVRM: Xid"),
    _r("nv_fallen_off_bus", r"fallen off\s+(?:NVRM:\s+)?the bus", "device_lost", C, "nvidia",
       "the GPU fell off the PCIe bus and does not answer", "device_lost",
       "fallen off"),
    _r("nv_gsp_timeout", r"waiting for RPC response from \S+ GSP|GSP (?:heartbeat|watchdog)\b.*"
       r"(?:timeout|timed out|fail|miss)|missed GSP heartbeat|GSP RPC error|GSP crashed", "gsp_error", C,
       "nvidia", "the GPU's GSP firmware stopped answering", "gsp",
       "GSP"),
    _r("nv_rm_init_failed", r"RmInitAdapter failed|NVIDIA probe routine failed", "gpu_missing", C, "nvidia",
       "the NVIDIA driver could not initialise a GPU", "device_lost",
       "RmInitAdapter failed|NVIDIA probe routine failed"),
    # --- AMD: failed recovery and lost devices (before the generic reset rules) ---------------------
    _r("amd_device_lost", r"device lost from bus!", "device_lost", C, "amd",
       "the GPU fell off the PCIe bus", "device_lost",
       "device lost from bus!"),
    _r("amd_recovery_failed", r"GPU Recovery Failed: ?-?\d+|GPU recovery failed|"
       r"GPU reset(?:\(\d+\))? failed|GPU reset end with ret = -\d+|ASIC reset failed|"
       r"(?:MODE\d|BACO) reset failed", "reset_failed", C, "amd",
       "the driver's full GPU reset failed: the GPU is unusable until a reboot", "device_lost",
       "Recovery Failed|recovery failed|GPU reset|ASIC reset failed|reset failed"),
    _r("amd_wedged_recovered", r"device wedged, but recovered through reset", "gpu_reset", I, "amd",
       "the GPU hung and a reset recovered it", "reset",
       "device wedged"),
    _r("amd_wedged", r"device wedged", "gpu_wedged", C, "amd",
       "the GPU is wedged and needs recovery", "device_lost",
       "device wedged"),
    # --- AMD: hangs --------------------------------------------------------------------------------
    _r("amd_sq_intr", r"\bsq_intr: error", "sq_intr", W, "amd",
       "shader wave error interrupt (SQ): a kernel on the GPU faulted", "gpu_fault",
       "sq_intr"),
    _r("amd_ring_timeout", r"\bring \S+ timeout", "ring_timeout", W, "amd",
       "a GPU ring stopped completing jobs (job timeout)", "gpu_fault",
       "timeout"),
    _r("amd_mes_no_response", r"MES failed to respon", "ring_timeout", C, "amd",
       "the micro-engine scheduler firmware stopped answering", "gpu_fault",
       "MES failed to respon"),
    _r("amd_mes_failed", r"\bMES\b.*(?:unrecoverable|failed)|failed to \w+ hardware queue (?:from|to) MES",
       "ring_timeout", W, "amd", "the micro-engine scheduler failed a queue operation", "gpu_fault",
       "MES"),
    _r("amd_kfd_preempt", r"qcm fence wait loop timeout|unsuccessful queues preemption|"
       r"queue preemption time ?out|Failed to evict (?:process )?queue|Failed to quiesce KFD|"
       r"Failed to restore (?:process )?queues", "ring_timeout", W, "amd",
       "KFD could not preempt the compute queues", "gpu_fault",
       "qcm fence|preemption|Failed to evict|Failed to quiesce|Failed to restore"),
    _r("amd_ip_hung", r"IP block:\S+ is hung", "ring_timeout", W, "amd",
       "a GPU IP block is hung", "gpu_fault",
       "is hung"),
    _r("amd_ring_test_failed", r"\bring \S+ test failed", "ring_timeout", W, "amd",
       "a GPU ring failed its self-test", "gpu_fault",
       "test failed"),
    # --- AMD: resets --------------------------------------------------------------------------------
    _r("amd_reset_begin", r"GPU reset begin", "gpu_reset", W, "amd",
       "the driver started a full GPU reset; VRAM and contexts may be lost", "reset",
       "GPU reset begin"),
    _r("amd_reset_method", r"\b(?:MODE\d|BACO) reset\s*$", "gpu_reset", W, "amd",
       "a full GPU reset is running", "reset",
       "MODE|BACO"),
    _r("amd_ring_reset_failed", r"\b(?:Ring \S+|\w+ queue) reset failed", "gpu_reset", W, "amd",
       "a per-ring reset failed; the driver escalates to a full reset", "reset",
       "reset failed"),
    _r("amd_reset_succeeded", r"GPU reset(?:\(\d+\))? succeeded|Ring \S+ reset succeeded", "gpu_reset", I, "amd",
       "the GPU reset succeeded", "reset",
       "reset succeeded|) succeeded"),
    _r("amd_ring_reset_start", r"Starting \S+ ring reset", "gpu_reset", I, "amd",
       "the driver is resetting one ring", "reset",
       "ring reset"),
    _r("amd_vram_lost", r"VRAM is lost due to GPU reset", "gpu_reset", W, "amd",
       "VRAM contents were lost in the reset: every GPU process must restart", "reset",
       "VRAM is lost"),
    # --- AMD: memory, RAS, SMU ----------------------------------------------------------------------
    _r("amd_page_fault", r"\[(?:gfx|mm)hub\d*\] (?:no-retry |retry )?page fault|\bVM fault \(0x|"
       r"\w+_L2_PROTECTION_FAULT_STATUS:", "page_fault", W, "amd",
       "GPU page fault: a process touched unmapped GPU memory", "gpu_fault",
       "page fault|VM fault|_L2_PROTECTION_FAULT_STATUS"),
    _r("amd_ras_uncorrectable", r"\b(?:uncorrectable|uncorrected) (?:hardware )?errors? (?:detected|occurred)|"
       r"RAS controller interrupt|ERREVENT_ATHUB_INTERRUPT|poison (?:is )?consumed", "ras_error", C, "amd",
       "uncorrectable hardware error (RAS)", "ras",
       "uncorrect|Uncorrect|RAS controller|ERREVENT_ATHUB|poison"),
    _r("amd_ras_correctable", r"\bcorrectable (?:hardware )?errors? detected", "ras_error", I, "amd",
       "correctable hardware error (RAS)", "ras",
       "correctable"),
    _r("amd_smu_failure", r"\bSMU\b.*(?:fail|timeout|[Tt]imed out|not done)|\bsmu_\w+.*(?:failed|timeout)",
       "smu_error", W, "amd", "the power-management firmware (SMU) failed a request", "gpu_fault",
       "SMU|smu_"),
    # --- PCIe AER ------------------------------------------------------------------------------------
    _r("aer_recovery_failed", r"AER: Device recovery failed", "device_lost", C, "pcie",
       "PCIe error recovery failed: the devices behind this port are lost", "device_lost",
       "AER: Device recovery failed"),
    _r("aer_fatal", r"Uncorrect(?:ed|able) \(Fatal\)|DPC: containment event", "pcie_aer", C, "pcie",
       "fatal uncorrected PCIe error", "aer",
       "(Fatal)|DPC: containment"),
    _r("aer_nonfatal", r"Uncorrect(?:ed|able) \(Non-Fatal\)", "pcie_aer", W, "pcie",
       "uncorrected, non-fatal PCIe error", "aer",
       "(Non-Fatal)"),
    _r("aer_corrected", r"AER: Correct(?:ed|able) error|severity=Correct(?:ed|able)", "pcie_aer", I, "pcie",
       "corrected PCIe error (the link retried)", "aer",
       "AER: Correct|severity=Correct"),
)

# Lines that open a kernel oops report, with the severity when a GPU driver is in the trace.
OOPS_HEADERS: tuple[tuple[str, Severity], ...] = (
    (r"^(?:BUG: |kernel BUG at |Oops: |Kernel panic - not syncing|general protection fault|"
     r"Unable to handle kernel )", C),
    (r"^WARNING: CPU: \d+ PID: \d+ at |^-+\[ cut here \]-+$", W),
)
OOPS_END = r"---\[ end (?:trace|Kernel panic)"
OOPS_HINTS = ("+0x", "BUG", "Oops", "panic", "general protection", "Unable to handle", "WARNING: CPU", "cut here",
              "end trace", "end Kernel panic")
# A stack frame: `func+0x12/0x60 [module]`, in `RIP:`, `IP:` and call-trace lines alike.
FRAME = r"[\w.]+\+0x[0-9a-f]+/0x[0-9a-f]+(?: \[(?P<module>\w+)\])?"
GPU_MODULES = frozenset({"amdgpu", "amdkfd", "amdxcp", "radeon", "nvidia", "nvidia_uvm", "nvidia_drm",
                         "nvidia_modeset", "nouveau", "i915", "xe"})
GPU_DRIVERS = frozenset({"amdgpu", "radeon", "nvidia", "nouveau", "i915", "xe"})


@dataclass(frozen=True, slots=True)
class Escalation:
    """`kind` on a GPU that had `after` within `within_seconds` becomes `severity`."""

    after: str
    kind: str
    within_seconds: float
    severity: Severity
    why: str


ESCALATIONS: tuple[Escalation, ...] = (
    Escalation("sq_intr", "gpu_reset", 120.0, C,
               "a reset right after shader wave errors: the pattern that precedes a lost GPU"),
)
