"""NVIDIA Xid catalog: severity and meaning per Xid (NVIDIA's "XID Errors" table, condensed).

Application-caused Xids (13, 31, 43, ...) are warnings: the process died, the GPU is fine. Xids that
mean the GPU or its firmware is broken are critical. Config `[kernel] xid = {"13" = "critical"}` overrides:
`judge` applies it, for Xids read from the kernel log and from NVML events alike.
"""

from collections.abc import Mapping

from gpuwarden.core.model import Severity

W, C, I = Severity.WARNING, Severity.CRITICAL, Severity.INFO

XIDS: dict[int, tuple[Severity, str]] = {
    8: (W, "GPU stopped processing (channel timeout)"),
    13: (W, "graphics engine exception (usually the application's bug)"),
    31: (W, "GPU memory page fault (usually the application's bug)"),
    32: (W, "invalid or corrupted push buffer stream"),
    38: (W, "driver firmware error"),
    43: (W, "GPU stopped processing a channel (the application was reset)"),
    45: (I, "preemptive cleanup after an earlier error"),
    48: (C, "double-bit ECC error"),
    56: (W, "display engine error"),
    57: (W, "error programming the video memory interface"),
    61: (C, "internal micro-controller breakpoint"),
    62: (C, "internal micro-controller halt"),
    63: (W, "ECC page retirement or row remapping recorded"),
    64: (C, "ECC page retirement or row remapping failed"),
    68: (W, "video decoder exception"),
    69: (W, "graphics engine class error"),
    74: (C, "NVLink error"),
    79: (C, "GPU has fallen off the bus"),
    92: (W, "high single-bit ECC error rate"),
    94: (W, "contained ECC error: the affected application must restart"),
    95: (C, "uncontained ECC error: the GPU must be reset"),
    109: (W, "context switch timeout"),
    119: (C, "GSP RPC timeout: the GPU firmware stopped answering"),
    120: (C, "GSP error"),
    121: (W, "C2C link corrected error"),
    123: (W, "SPI PMU RPC write failure"),
    136: (C, "NVLink link training failed"),
    140: (C, "unrecovered ECC error"),
    143: (C, "GPU initialization failure"),
    144: (W, "NVLink SAW MVB error"),
    149: (W, "NVLink NETIR error"),
    154: (C, "GPU recovery action changed: a reset or reboot is required"),
    155: (C, "NVLink link down"),
}

UNKNOWN = (W, "Xid not in gpuwarden's catalog")

# Xids that are one process's own (NVIDIA's table: "user application error"): the pid in the line raised it. In
# the others the pid is only the process the driver ran for when it noticed the GPU (or its firmware, memory,
# link) failing: the fault is the GPU's, every process on it is hit.
PROCESS_XIDS = frozenset({13, 31, 43, 45, 68, 69, 94, 109})


def describe(xid: int) -> tuple[Severity, str]:
    return XIDS.get(xid, UNKNOWN)


def judge(xid: int, overrides: Mapping[int, Severity] | None = None, caused_by: int | None = None
          ) -> tuple[Severity, str]:
    """An Xid's severity and meaning ("Xid N: ..."): the catalog's, at least as severe as the Xid that caused it
    when the catalog knows that one (an Xid 45 cleanup after NVLink Xid 149 is a warning, not info), then the
    configured override, which has the last word."""
    severity, meaning = describe(xid)
    if caused_by in XIDS:
        severity = max(severity, XIDS[caused_by][0])
        meaning = f"{meaning}, caused by Xid {caused_by}"
    return (overrides or {}).get(xid, severity), f"Xid {xid}: {meaning}"


# Xids that also stand for an event of another kind: (kind, severity, why). The classifier makes it beside the
# Xid event, once per GPU, so that a lone Xid 79 (no "fallen off the bus" line of its own) is still a lost GPU.
IMPLIES: dict[int, tuple[str, Severity, str]] = {
    79: ("device_lost", C, "Xid 79: the GPU fell off the PCIe bus and does not answer"),
}
