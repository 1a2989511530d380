"""The kernel-line rule catalog, as data, derived from the drivers' own message templates.

Each rule: a stable name (what `[kernel] disable_rules` and `[kernel.rule_override.NAME]` refer to), a regular
expression searched in the message text (the part after any timestamp, `host kernel:` or `<N>` printk-level
prefix), the event kind and severity, the vendor, what the line means, a runbook key, its provenance (the
source files and format strings the expression was written from), lines it must match (`examples`: each from
the real-log corpus in tests/corpus/kernel, or made from one of its format strings with a `ffff:` address) and
lines it must not (`counter_examples`). Its Aho-Corasick hints are derived from the expression (kernel/hints.py).
Paths are in the Linux tree (`amdgpu/` is drivers/gpu/drm/amd/amdgpu, `amdkfd/` and `pm/` likewise), the PCI and
firmware cores (`pci/`, `firmware/`, `acpi/`), or NVIDIA/open-gpu-kernel-modules (`nvidia/`, `kernel-open/`).
tests/data/amdgpu-templates.json pins the amdgpu error templates; tests/unit/test_templates.py checks each is
classified or ignored with a reason, and tests/unit/test_rules.py checks every rule against its examples.

The first rule that matches a line wins, so specific rules stand before general ones. Config rules
(`[[kernel.rule]]`) are tried before these.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import NamedTuple

from gpuwarden.core.model import Severity
from gpuwarden.core.plain import plain
from gpuwarden.core.registry import register_rules
from gpuwarden.kernel.hints import hints as literal_hints

I, W, C = Severity.INFO, Severity.WARNING, Severity.CRITICAL
A = "amdgpu ffff:fe:1f.7: amdgpu: "  # the prefix of amdgpu lines made from a format string


class Example(NamedTuple):
    text: str  # the message text, as the classifier sees it
    origin: str  # the tests/corpus/kernel file it was copied from, or "template": made from a format string


def corpus(file: str, text: str) -> Example:
    return Example(text, file)


def template(text: str) -> Example:
    return Example(text, "template")


@plain
class Rule:
    """A kernel log line that means a fault, and what to do about it."""

    name: str
    pattern: str
    kind: str
    severity: Severity
    vendor: str
    meaning: str
    runbook: str
    sources: tuple[str, ...] = ()  # "file: format string" the pattern was written from
    quiet: bool = False  # a line inside another report: it feeds correlations but makes no event of its own
    process_follows: bool = False  # the driver may name the faulting process on the next line (PROCESS_FORMATS)
    examples: tuple[Example, ...] = ()
    counter_examples: tuple[str, ...] = ()

    @property
    def hints(self) -> tuple[str, ...]:
        """Literals of which every match contains one; () means "try every line"."""
        return literal_hints(self.pattern)


# --- Where a driver's line starts ----------------------------------------------------------------------------
# A rule acts only on a line that provably comes from a driver: its expression must match right after the
# driver's own prefix, at the start of the message, never in the middle of a line. The kernel prints text a user
# chose at the start of some lines of its own (a task's name in `<comm>[pid]: segfault at`, a mount option in
# `tmpfs: Unknown parameter '...'`): none of them starts with a driver's prefix, and a task name (at most 15
# characters, then `[pid]`) is too short to spell one together with any rule.
BDF = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
# dev_printk's `driver 0000:03:00.0: `: on /dev/kmsg and in the journal such a line carries the device as metadata
DEVICE_PREFIX = rf"(?P<dev_driver>[\w-]+) (?P<dev>{BDF}): "
# pr_fmt, DRM and NVRM prefixes (printk without a device: no metadata), and the class device kfd
_DRIVER_START = (r"(?:amdgpu|amdkfd|radeon|drmn\d+|NVRM|nvidia-modeset|nvidia-uvm|kfd kfd|pcieport|AMD-Vi): |"
                 r"\[drm(?::[\w.]+(?: \[\w+\])?| ERROR ?:[\w.]+)?\] ")
# what drivers put after their first prefix before the message proper. amdgpu's RAS reports put their event id
# and the die before it: amdgpu/amdgpu_ras.c amdgpu_ras_event_log_print "{%llu}%pV" with "socket: %d, die: %d, %lld
# new uncorrectable hardware errors detected in %s block\n", and ras/ (Linux 6.17+) "{%llu} socket: %d, die: %d, ..."
_DRIVER_MORE = (r"(?:amdgpu: |\[drm(?::[\w.]+(?: \[\w+\])?| ERROR ?:[\w.]+)?\] |\*ERROR\* |ERROR: |"
                rf"\[powerplay\] |AER: |DPC: |GPU {BDF}: |GPU\d+ |\{{\d+\}} ?|socket: \d+, die: \d+, |_?\w+: )")
# Spaces and tabs only before the prefix: a record's text after a newline it carries is never read as a new line
DRIVER_PREFIX = rf"^[ \t]*(?:{DEVICE_PREFIX}|{_DRIVER_START})(?:{_DRIVER_MORE})*"
# The first characters of a line that may be a driver's: the classifier's cheap gate
DRIVER_START = rf"^[ \t]*(?:[\w-]+ {BDF}: |{_DRIVER_START})"



def anchored(pattern: str) -> str:
    """A built-in rule's expression, matched right after a driver's prefix at the start of the message."""
    return rf"{DRIVER_PREFIX}(?:{pattern})"


_INLINE_FLAGS = r"^\(\?([aiLmsux]+)\)"


def config_anchored(pattern: str) -> str:
    """A `[[kernel.rule]]` expression, matched right after a driver's prefix at the start of the message: a device
    prefix, a prefix the built-in rules know, or the prefix of a driver gpuwarden does not know (its pr_fmt
    `driver: `, or dev_printk's `driver device: `, `usb 1-3: `). Never at the very start of a line, where the kernel
    prints a task's name. Leading inline flags (`(?i)`) apply to the rule's own expression only."""
    if m := re.match(_INLINE_FLAGS, pattern):
        pattern = f"(?{m.group(1)}:{pattern[m.end():]})"
    return rf"^[ \t]*(?:{DEVICE_PREFIX}|{_DRIVER_START}|[\w.-]+(?: [\w.:-]+)?: )(?:{_DRIVER_MORE})*(?:{pattern})"


# Lines the kernel prints with text a user chose in them: never a rule's line, an oops header or frame, a process
# line, nor a line of an open report. Read by their structure, the user's fields whatever they hold: a task's name
# (`comm`, 15 bytes, any of them a newline or a control character, which a text log shows escaped: dmesg `\x0a`,
# rsyslog `#012`) and the file a fault's code was mapped from (any name, newlines too). The fixed words after the
# name are searched for, never the name: `<comm>[pid]: segfault at …` (arch/x86/mm/fault.c show_signal_msg),
# `<comm>[pid] bad frame in …`, `traps: <comm>[pid] trap …`/`general protection fault …` (arch/x86/kernel/traps.c),
# `<comm> (pid): …` (drop_caches, and others), `<comm>: page allocation failure` (mm/page_alloc.c), `<comm> invoked
# oom-killer` (mm/oom_kill.c), tmpfs/mount options and `audit`; and, as its last field, the mapping a fault's ip is
# in (mm/memory.c print_vma_addr " in %s[%lx+%lx]", since 6.x "[%lx,%lx+%lx]", then " likely on CPU %d (core %d,
# socket %d)"): a line a mapped file's name broke in two still ends with it. Each is also a counter-example of every
# rule (tests/unit/test_rules.py), and tests/security prints them for real
# (classifier.user_text reads them; the name is never matched, only its length checked)
COMM_LEN = 15  # TASK_COMM_LEN - 1
# the fixed words right after a task's name (searched in a line's first USER_TEXT_SPAN characters)
USER_TEXT_AFTER_NAME = r"\[\d+\]:? | \(\d+\): |: page allocation failure| invoked oom-killer"
USER_TEXT_SPAN = 4 * COMM_LEN + 16  # a name of 15 escaped characters (`\x0a`), leading spaces, the words
# lines that start with the kernel's words, a user's text after them
USER_TEXT_START = (r"[ \t]*(?:traps: |audit[:(]|potentially unexpected fatal signal|"
                   r"[\w.-]+: (?:Unknown parameter '|Unrecognized mount option))")
# a text log shows a control character of a name escaped: dmesg `\x0a`, rsyslog `#012`
NAME_ESCAPE = r"\\x[0-9a-fA-F]{2}|#\d{3}"
# the end of a line that names the mapping a fault's ip is in: matched at the line's last `[`
USER_TEXT_TAIL = r"\[(?:[0-9a-f]+,)?[0-9a-f]+\+[0-9a-f]+\](?: likely on CPU \d+ \(core \d+, socket \d+\))?\s*\Z"
FORGED = (
    "ring x timeout[4242]: segfault at 0 ip 0000000000401000 sp 00007ffc00000000 error 6 in a.out[401000+1000]",
    "sq_intr: error[4244]: segfault at 0 ip 0000000000401000 sp 00007ffc00000000 error 6",
    "traps: sq_intr: error[4244] general protection fault ip:401000 sp:7ffc00000000 error:0 in a.out[401000+1000]",
    "tmpfs: Unknown parameter 'NVRM: Xid (PCI:ffff:fe:1f): 79'",
    "tmpfs: Unknown parameter 'amdgpu ffff:fe:1f.7: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1'",
    "BUG: soft locku[77]: segfault at 0 ip 0000000000401000 sp 00007ffc00000000 error 6",
    'audit: type=1400 audit(1700000000.1:4): apparmor="DENIED" comm="NVRM: Xid (PCI:ffff:fe:1f): 79"',
    "GPU reset begin![99]: segfault at 0 ip 0000000000401000 sp 00007ffc00000000 error 6",
    # issue 37: a newline ends the name (a kmsg record keeps it, `\x0a`), a stack frame for a name, a file named
    # like a GPU, and the second line of a file name broken by a newline (a text log that splits records)
    "NVRM: SMU fail\n[4245]: segfault at 0 ip 00007f0000001000 sp 00007ffc00000000 error 4 in ffff:fe:00.0"
    "[0,7f0000001000+1000] likely on CPU 0 (core 0, socket 0)",
    "BUG: \n[4246]: segfault at 0 ip 00007f0000001000 sp 00007ffc00000000 error 4 in NVRM (PCI:ffff:fe:00.0)"
    "[0,7f0000001000+1000] likely on CPU 1 (core 1, socket 0)",
    "a+0x0/0x0 [xe][4247]: segfault at 0 ip 00007f0000001000 sp 00007ffc00000000 error 4 in ffff:fe:00.0"
    "[0,7f0000001000+1000] likely on CPU 0 (core 0, socket 0)",
    "NVRM: Xid (PCI:ffff:fe:1f): 79, x[0,7f0000001000+1000] likely on CPU 0 (core 0, socket 0)",
    "NVRM: SMU fail\\x0a[4248]: segfault at 0 ip 00007f0000001000 sp 00007ffc00000000 error 4",
    "traps: BUG: \n[4249] general protection fault ip:401000 sp:7ffc00000000 error:0 in a.out[401000+1000]",
)


def _r(name, pattern, kind, severity, vendor, meaning, runbook, *sources, quiet=False, process_follows=False,
       examples=(), counter_examples=()) -> Rule:
    return Rule(name, pattern, kind, severity, vendor, meaning, runbook, sources, quiet, process_follows, examples,
                (*counter_examples, *FORGED))


RULES: tuple[Rule, ...] = (
    # --- NVIDIA -------------------------------------------------------------------------------------
    _r("nv_xid", r"Xid \(PCI:[0-9a-fA-F:.]+(?: [^)]*)?\): (?P<xid>\d+)", "xid", W, "nvidia",
       "NVIDIA Xid error", "xid",
       'kernel-open/nvidia/nv-tracepoint.h: "Xid (PCI:%s): %u, %s"',
       'nvidia/src/kernel/gpu/rc/kernel_rc.c: " caused by previous Xid %d"',
       examples=(corpus("020-nv-xid-13-and-43-sm-exceptions.log",
                        "NVRM: Xid (PCI:0000:38:00): 43, pid=2924364, name=pt_main_thread, Ch 00000008"),
                 corpus("023-nv-xid-31-13-32-mmu-fault-graphics-exception.log",
                        "NVRM: Xid (PCI:0000:01:00): 13, Graphics Exception: ESR 0x4041b0=0x0")),
       counter_examples=("NVRM: Xid (PCI:ffff:fe:1f): unknown error",
                         "nvidia-nvlink: Nvlink Core is being initialized, major device number 239")),
    _r("nv_fallen_off_bus",
       rf"(?:GPU has |GPU at {BDF} has )?fallen off\s+(?:NVRM:\s+)?the bus|"
       r"The NVIDIA GPU [^\n]*(?:\n[^\n]*)*?fallen off\s+the bus",
       "device_lost", C, "nvidia",
       "the GPU fell off the PCIe bus and does not answer", "device_lost",
       'nvidia/arch/nvalloc/unix/src/osinit.c: "GPU has fallen off the bus.\\n"',
       'nvidia/arch/nvalloc/unix/src/osapi.c: "NVRM: fallen off the bus and is not responding to commands.\\n"',
       'the closed RM before the open modules (295 to 390, no public source; its os_pci_init_handle in'
       ' kernel/os-interface.c follows it): "NVRM: GPU at %04x:%02x:%02x.%x has fallen off the bus.\\n"',
       examples=(corpus("027-nv-xid-79-fallen-off-bus-journal-rc-all-channels.log",
                        "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus."),
                 template("NVRM: GPU at ffff:fe:1f.7 has fallen off the bus.")),
       counter_examples=("NVRM: fallen off the stage",)),
    _r("nv_gsp_timeout",
       r"Timeout after \d+s of waiting for RPC response|rpcRecvPoll timedout|GSP RM heartbeat timed out|"
       r"_kgspIsHeartbeatTimedOut: Heartbeat"
       r" timed out|\*+ GSP Timeout \*+|RPC (?:event )?history \(CPU [<-]|\**\s*GSP-CrashCat Report|"
       r"kflcnCoreDump\w*: |Memory Subsystem Error detected",
       "gsp_error", C, "nvidia", "the GPU's GSP firmware stopped answering or crashed", "gsp",
       'nvidia/src/kernel/gpu/gsp/kernel_gsp.c: "Timeout after %llus of waiting for RPC response from GPU%d GSP!'
       ' Expected function %d (%s) sequence %u (0x%llx 0x%llx)."',
       'nvidia/src/kernel/gpu/gsp/kernel_gsp.c: "rpcRecvPoll timedout for fn %d!\\n"',
       'nvidia/src/kernel/gpu/gsp/kernel_gsp.c: "GSP RM heartbeat timed out\\n"',
       'nvidia/src/kernel/gpu/gsp/kernel_gsp.c: "Heartbeat timed out, currentTimeMs %u heartbeat %u'
       ' heartbeatWithOffsetMs %u diff %u timeout %u\\n"',
       'nvidia/src/kernel/gpu/gsp/kernel_gsp.c: "***... GSP Timeout ...***\\n"',
       'nvidia/src/kernel/gpu/gsp/kernel_gsp.c: "GPU%d RPC history (CPU -> GSP):\\n"',
       'nvidia/src/kernel/gpu/gsp/kernel_gsp.c: "GPU%d RPC event history (CPU <- GSP):\\n"',
       'nvidia/src/kernel/gpu/gsp/arch/turing/kernel_gsp_tu102.c: "***... GSP-CrashCat Report ...***\\n"',
       'nvidia/src/kernel/gpu/falcon/kernel_falcon.c: "TRACE: %02u = 0x%016llx\\n"',
       'nvidia/src/kernel/gpu/mmu/kern_gmmu.c: "Memory Subsystem Error detected. kbusSendSysmembarSingle failed.\\n"',
       examples=(corpus("019-nv-xid-119-gsp-rpc-timeout.log", "NVRM: GPU4 RPC history (CPU -> GSP):"),
                 corpus("050-nv-gsp-heartbeat-timed-out-no-xid-journal.log",
                        "NVRM: GPU0 _kgspRpcRecvPoll: GSP RM heartbeat timed out"),
                 corpus("052-nv-gsp-falcon-core-dump-talos.log",
                        "NVRM: kflcnCoreDumpNondestructive_IMPL: TRACE: 08 = 0x0000000004d4b1a0"),
                 template("NVRM: kgspHealthCheck_TU102: ********** GSP-CrashCat Report **********")),
       counter_examples=("NVRM: GSP firmware loaded",
                         "NVRM: RPC history is empty")),
    _r("nv_init_failed", r"RmInitAdapter failed|rm_init_adapter failed|(?:The )?NVIDIA probe routine failed|"
       r"Cannot initialize GSP firmware RM|unexpected WPR2 already up",
       "gpu_missing", C, "nvidia", "the NVIDIA driver could not initialise a GPU", "device_lost",
       'nvidia/arch/nvalloc/unix/src/osinit.c: "RmInitAdapter failed! (0x%x:0x%x:%d)\\n"',
       'kernel-open/nvidia/nv.c: "rm_init_adapter failed, device minor number %d\\n"',
       'kernel-open/nvidia/nv.c: "NVRM: The NVIDIA probe routine failed for %d device(s).\\n"',
       'nvidia/arch/nvalloc/unix/src/osinit.c: "RmInitAdapter: Cannot initialize GSP firmware RM\\n"',
       'nvidia/src/kernel/gpu/gsp/kernel_gsp.c: "unexpected WPR2 already up, cannot proceed with booting GSP\\n"',
       examples=(corpus("053-nv-rminitadapter-gsp-firmware-gfw-boot.log",
                        "NVRM: GPU 0000:98:00.0: RmInitAdapter failed! (0x62:0x65:1792)"),
                 corpus("017-nv-fallen-off-bus-no-xid-multiline.log",
                        "NVRM: The NVIDIA probe routine failed for 1 device(s).")),
       counter_examples=("NVRM: RmInitAdapter succeeded",)),
    _r("nv_modeset_timeout",
       r"ERROR: GPU:\d+: (?:Idling display engine timed out|Error while waiting for GPU progress)",
       "ring_timeout", W, "nvidia", "the display driver (nvidia-modeset) timed out waiting for the GPU", "gpu_fault",
       'src/nvidia-modeset/src/nvkms-evo.c: "Idling display engine timed out: 0x%08x:%d:%d:%d"',
       'src/nvidia-modeset/src/nvkms-evo.c: "Error while waiting for GPU progress: 0x%08x:%d %d:%d:%d:%d"',
       examples=(template("nvidia-modeset: ERROR: GPU:0: Idling display engine timed out: 0x0000c67d:0:0:1130"),
                 template("nvidia-modeset: ERROR: GPU:0: Error while waiting for GPU progress: 0x0000c67d:0 2:0:4048"
                          ":4040")),
       counter_examples=("nvidia-modeset: Loading NVIDIA UNIX Open Kernel Mode Setting Driver for x86_64",
                         "nvidia-modeset: WARNING: GPU:0: Unable to read EDID for display device DP-2")),
    _r("nv_modeset_channel_state", r"ERROR: GPU:\d+: Failed to query display engine channel state",
       "ring_timeout", W, "nvidia", "the display engine did not answer nvidia-modeset (its channel state could not be "
       "read): the GPU stopped answering, often at driver unload after it failed", "gpu_fault",
       'src/nvidia-modeset/src/nvkms-evo1.c: "Failed to query display engine channel state: 0x%08x:%d:%d:0x%08x"',
       examples=(template("nvidia-modeset: ERROR: GPU:0: Failed to query display engine channel state: "
                          "0x0000c57e:4:0:0x0000000f"),),
       counter_examples=("nvidia-modeset: ERROR: GPU:0: DP-0: Failed to disable DisplayPort audio stream-3",
                         "nvidia-modeset: WARNING: GPU:0: Lost display notification (0:0x00000000); continuing.")),
    # --- AMD: failed recovery and lost devices (before the generic reset rules) ---------------------
    _r("amd_device_lost", r"device lost from bus!", "device_lost", C, "amd",
       "the GPU fell off the PCIe bus", "device_lost",
       'amdgpu/amdgpu_device.c: "device lost from bus!"',
       examples=(template(A + "device lost from bus!"),),
       counter_examples=("amdgpu ffff:fe:1f.7: amdgpu: device lost from bus",)),
    _r("amd_recovery_failed", r"GPU Recovery Failed: ?-?\d+|GPU recovery failed|GPU reset(?:\(\d+\))? failed|"
       r"GPU reset end with ret = -\d+|ASIC reset failed|(?:GPU )?(?i:mode[12]|baco) reset failed|"
       r"PCIe error recovery failed|"
       r"pre asic reset failed",
       "reset_failed", C, "amd",
       "the driver's full GPU reset failed: the GPU is unusable until a reboot", "device_lost",
       'amdgpu/amdgpu_job.c: "GPU Recovery Failed: %d\\n"',
       'amdgpu/amdgpu_device.c: "GPU reset(%d) failed\\n"',
       'amdgpu/amdgpu_device.c: "GPU reset end with ret = %d\\n"',
       'amdgpu/amdgpu_device.c: "ASIC reset failed with error, %d for drm dev, %s"',
       'amdgpu/amdgpu_device.c: "GPU mode1 reset failed\\n"',
       'amdgpu/amdgpu_device.c: "PCIe error recovery failed, err:%d"',
       'amdgpu/amdgpu_device.c: "GPU pre asic reset failed with err, %d for drm dev, %s "',
       examples=(corpus("134-amd-psp-resume-failed-gpu-reset-1-failed-qcm.log",
                        "amdgpu 0000:0b:00.0: amdgpu: GPU reset(1) failed"),
                 corpus("135-amd-suspend-smu-psp-failed-mode1-reset-failed.log",
                        "amdgpu 0000:03:00.0: amdgpu: GPU mode1 reset failed")),
       counter_examples=("amdgpu 0000:0c:00.0: Ring gfx_0.0.0 reset failed",
                         "amdgpu 000d:31:00.0: GPU reset(3) succeeded!")),
    _r("amd_smu_resume_failed", r"resume of IP block <smu> failed|SMC engine is not correctly up|"
       r"Failed to setup smc hw",
       "smu_error", C, "amd", "the power-management firmware (SMU) did not start or come back: the GPU is unusable",
       "device_lost",
       'amdgpu/amdgpu_device.c: "resume of IP block <%s> failed %d\\n"',
       'pm/swsmu/amdgpu_smu.c: "SMC engine is not correctly up!\\n"',
       'pm/swsmu/amdgpu_smu.c (smu_hw_init, smu_resume): "Failed to setup smc hw!\\n"',
       examples=(corpus("087-amd-mi100-runtime-pm-smu-resume-failed.log",
                        "amdgpu 0000:03:00.0: amdgpu: resume of IP block <smu> failed -5"),
                 template("amdgpu ffff:fe:1f.7: Failed to setup smc hw!")),
       counter_examples=("amdgpu 0000:83:00.0: amdgpu: SMU is resumed successfully!",
                         "amdgpu ffff:fe:1f.7: amdgpu: Failed to setup smc table")),
    _r("amd_resume_failed", r"resume of IP block <\w+> failed|amdgpu_device_ip_resume failed",
       "reset_failed", C, "amd", "a GPU block failed to resume after a reset or sleep: the GPU is unusable",
       "device_lost",
       'amdgpu/amdgpu_device.c: "resume of IP block <%s> failed %d\\n"',
       'amdgpu/amdgpu_device.c: "amdgpu_device_ip_resume failed (%d).\\n"',
       examples=(corpus("134-amd-psp-resume-failed-gpu-reset-1-failed-qcm.log",
                        "[drm:amdgpu_device_fw_loading [amdgpu]] *ERROR* resume of IP block <psp> failed -62"),
                 corpus("087-amd-mi100-runtime-pm-smu-resume-failed.log",
                        "amdgpu 0000:03:00.0: amdgpu: amdgpu_device_ip_resume failed (-5).")),
       counter_examples=("xhci_hcd 0000:00:14.0: Port resume timed out, port 1-6: 0x400603",)),
    _r("amd_init_failed",
       r"(?:hw_init|sw_init|early_init|late_init) of IP block <\w+> failed|amdgpu_device_ip_(?:late_)?init failed|"
       r"Fatal error during GPU init|amdgpu asic init failed|asic reset on init failed|gpu post error!",
       "gpu_missing", C, "amd", "the amdgpu driver could not initialise the GPU", "device_lost",
       'amdgpu/amdgpu_device.c: "hw_init of IP block <%s> failed %d\\n"',
       'amdgpu/amdgpu_device.c: "sw_init of IP block <%s> failed %d\\n"',
       'amdgpu/amdgpu_device.c: "early_init of IP block <%s> failed %d\\n"',
       'amdgpu/amdgpu_device.c: "late_init of IP block <%s> failed %d\\n"',
       'amdgpu/amdgpu_device.c: "amdgpu_device_ip_late_init failed\\n"',
       'amdgpu/amdgpu_device.c: "amdgpu_device_ip_init failed\\n"',
       'amdgpu/amdgpu_kms.c: "Fatal error during GPU init\\n"',
       'amdgpu/amdgpu_device.c: "amdgpu asic init failed\\n"',
       'amdgpu/amdgpu_device.c: "asic reset on init failed\\n"',
       'amdgpu/amdgpu_device.c: "gpu post error!\\n"',
       examples=(corpus("147-amd-init-mes-kiq-test-failed-fatal-error-during-gpu-init.log",
                        "[drm:amdgpu_device_init [amdgpu]] *ERROR* hw_init of IP block <gfx_v11_0> failed -110"),
                 corpus("147-amd-init-mes-kiq-test-failed-fatal-error-during-gpu-init.log",
                        "amdgpu 0000:03:00.0: amdgpu: Fatal error during GPU init")),
       counter_examples=("[drm] add ip block number 6 <powerplay>",
                         "amdgpu 0000:0b:00.0: amdgpu: SMU is initialized successfully!")),
    _r("amd_wedged_recovered", r"device wedged, but recovered through reset", "gpu_reset", I, "amd",
       "the GPU hung and a reset recovered it", "reset",
       'drm/drm_drv.c: "device wedged, %s\\n"',
       examples=(corpus("013-amd-ring-gfx-timeout-per-ring-reset-llama-server.log",
                        "amdgpu 0000:c2:00.0: [drm] device wedged, but recovered through reset"),),
       counter_examples=("amdgpu ffff:fe:1f.7: [drm] device wedged, needs recovery",)),
    _r("amd_wedged", r"device wedged", "gpu_wedged", C, "amd",
       "the GPU is wedged and needs recovery", "device_lost",
       'drm/drm_drv.c: "device wedged, %s\\n"',
       examples=(template("amdgpu ffff:fe:1f.7: [drm] device wedged, needs recovery"),),
       counter_examples=("amdgpu ffff:fe:1f.7: [drm] device unwedged",)),
    # --- AMD: hangs --------------------------------------------------------------------------------
    _r("amd_sq_intr", r"\bsq_intr: error", "sq_intr", W, "amd",
       "shader wave error interrupt (SQ): a kernel on the GPU faulted", "gpu_fault",
       'amdkfd/kfd_int_process_v9.c: "sq_intr: error, se %d, data 0x%x, sh %d, priv %d, wave_id %d,'
       ' simd_id %d, cu_id %d, err_type %d\\n"',
       'amdkfd/kfd_int_process_v10.c: "sq_intr: error, se %d, data 0x%x, sa %d, priv %d, wave_id %d,'
       ' simd_id %d, wgp_id %d, err_type %d\\n"',
       'amdkfd/kfd_int_process_v11.c: "sq_intr: error, detail 0x%08x, type %d, sh %d, priv %d, wave_id %d,'
       ' simd_id %d, wgp_id %d\\n"',
       examples=(corpus("001-amd-sq-intr-wave-errors.log",
                        "amdgpu: sq_intr: error, detail 0x00000000, type 1, sh 1, priv 1, wave_id 4,"
                        " simd_id 0, wgp_id 0"),),
       counter_examples=("amdgpu: disable_sq_intr: errors masked",)),
    _r("amd_ring_timeout", r"\bring \S+ timeout", "ring_timeout", W, "amd",
       "a GPU ring stopped completing jobs (job timeout)", "gpu_fault",
       'amdgpu/amdgpu_job.c: "ring %s timeout, signaled seq=%u, emitted seq=%u\\n"',
       'amdgpu/amdgpu_job.c: "ring %s timeout, but soft recovered\\n"', process_follows=True,
       examples=(corpus("115-amd-navi10-ring-reset-failed-baco-vram-lost.log",
                        "amdgpu 0000:28:00.0: ring gfx_0.0.0 timeout, signaled seq=57638, emitted seq=57641"),
                 corpus("069-amd-freebsd-illegal-reg-gfx-timeout-psp-unload-mode2.log",
                        "drmn0: ring gfx timeout, signaled seq=14416844, emitted seq=14416847")),
       counter_examples=("amdgpu 0000:03:00.0: amdgpu: ring gfx_0.0.0 uses VM inv eng 0 on hub 0",
                         "xhci_hcd 0000:00:14.0: Port resume timed out, port 1-6: 0x400603")),
    _r("amd_mes_no_response", r"MES failed to respon", "ring_timeout", C, "amd",
       "the micro-engine scheduler firmware stopped answering", "gpu_fault",
       'amdgpu/mes_v11_0.c: "MES failed to respond to msg=%s\\n"',
       'amdgpu/mes_v11_0.c: "MES failed to respond to msg=%d\\n"',
       examples=(corpus("060-amd-ring-reset-failed-mes-remove-queue-mode2.log",
                        "amdgpu 0000:c5:00.0: amdgpu: MES failed to respond to msg=REMOVE_QUEUE"),),
       counter_examples=("amdgpu ffff:fe:1f.7: amdgpu: MES enabled",)),
    _r("amd_mes_failed", r"failed to \w+ hardware queue (?:from|to) MES|MES might be in unrecoverable state|"
       r"failed to (?:unmap|map|reset) legacy queue|failed to (?:remove|reset) hardware queue|"
       r"failed to (?:suspend|resume) all gangs|MES is busy|MES ring buffer is full",
       "ring_timeout", W, "amd", "the micro-engine scheduler failed a queue operation", "gpu_fault",
       'amdgpu/amdgpu_mes.c (Linux 6.13+): "failed to remove hardware queue from MES, doorbell=0x%x\\n"',
       'amdgpu/amdgpu_mes.c (Linux 6.13+): "MES might be in unrecoverable state, issue a GPU reset\\n"',
       'amdgpu/amdgpu_mes.c: "failed to unmap legacy queue\\n"',
       'amdgpu/amdgpu_mes.c: "failed to map legacy queue\\n"',
       'amdgpu/amdgpu_mes.c: "failed to reset legacy queue\\n"',
       'amdgpu/amdgpu_mes.c: "failed to remove hardware queue, queue id = %d\\n"',
       'amdgpu/amdgpu_mes.c: "failed to reset hardware queue, queue id = %d\\n"',
       'amdgpu/amdgpu_mes.c: "failed to reset hardware queue by mmio, queue id = %d\\n"',
       'amdgpu/amdgpu_mes.c: "failed to suspend all gangs"',
       'amdgpu/amdgpu_mes.c: "failed to resume all gangs"',
       'amdgpu/mes_v11_0.c: "MES is busy\\n"',
       'amdgpu/mes_v11_0.c: "MES ring buffer is full.\\n"',
       examples=(corpus("060-amd-ring-reset-failed-mes-remove-queue-mode2.log",
                        "amdgpu 0000:c5:00.0: amdgpu: failed to unmap legacy queue"),
                 corpus("138-amd-mes-failed-sdma-ib-test-timed-out-ip-hung-reset.log",
                        "amdgpu: failed to remove hardware queue from MES, doorbell=0x1202")),
       counter_examples=("amdgpu ffff:fe:1f.7: amdgpu: MES is idle",
                         "amdgpu ffff:fe:1f.7: amdgpu: hardware queue added to MES")),
    _r("amd_kfd_preempt", r"qcm fence wait loop timeout|unsuccessful queues preemption|"
       r"queue preemption time ?out|Failed to evict (?:process )?queue|Failed to quiesce KFD|"
       r"Failed to restore (?:process )?queues", "ring_timeout", W, "amd",
       "KFD could not preempt the compute queues", "gpu_fault",
       'amdkfd/kfd_device_queue_manager.c: "qcm fence wait loop timeout expired\\n"',
       'amdkfd/kfd_device_queue_manager.c: "The cp might be in an unrecoverable state due to an unsuccessful'
       ' queues preemption\\n"',
       'amdkfd/kfd_process.c: "Failed to evict process queues\\n"',
       'amdgpu/amdgpu_amdkfd_gpuvm.c: "Failed to quiesce KFD\\n"',
       examples=(corpus("049-amd-kfd-qcm-fence-timeout-mode2-reset.log",
                        "amdgpu: qcm fence wait loop timeout expired"),
                 corpus("047-amd-mes-failed-to-response-evict-queue-reset-gfx-hung.log",
                        "amdgpu: Failed to evict process queues")),
       counter_examples=("amdgpu: Evicted process queues",
                         "workqueue: ib_cache_event_task [ib_core] hogged CPU for >10000us 4 times,"
                         " consider switching to WQ_UNBOUND")),
    _r("amd_ip_hung", r"IP block:\S+ is hung", "ring_timeout", W, "amd",
       "a GPU IP block is hung", "gpu_fault",
       'amdgpu/amdgpu_device.c: "IP block:%s is hung!\\n"',
       examples=(corpus("047-amd-mes-failed-to-response-evict-queue-reset-gfx-hung.log",
                        "amdgpu 0000:03:00.0: amdgpu: IP block:gfx_v11_0 is hung!"),),
       counter_examples=("amdgpu ffff:fe:1f.7: amdgpu: IP block:gfx_v11_0 is idle",)),
    _r("amd_ring_test_failed", r"\bring \S+ (?:ib )?test failed|\bIB test (?:failed|timed out)|\bib ring test failed",
       "ring_timeout", C, "amd", "a GPU ring failed its self-test: the ring cannot run jobs", "device_lost",
       'amdgpu/amdgpu_ring.c: "ring %s test failed (%d)\\n"',
       'amdgpu/amdgpu_mes.c: "ring %s ib test failed (%d)\\n"',
       'amdgpu/amdgpu_ib.c: "IB test failed on %s (%d).\\n"',
       'amdgpu/amdgpu_device.c: "ib ring test failed (%d).\\n"',
       'amdgpu/sdma_v6_0.c: "amdgpu: IB test timed out\\n"',
       examples=(corpus("059-amd-kiq-ring-test-failed-kcq-disable-baco-reset.log",
                        "amdgpu 0000:1d:00.0: [drm:amdgpu_ring_test_helper [amdgpu]] *ERROR* ring"
                        " kiq_2.1.0 test failed (-110)"),
                 corpus("138-amd-mes-failed-sdma-ib-test-timed-out-ip-hung-reset.log",
                        "[drm:sdma_v6_0_ring_test_ib [amdgpu]] *ERROR* amdgpu: IB test timed out")),
       counter_examples=("[drm:gfx_v8_0_ring_test_ring] ring test on 2 succeeded in 5 usecs",
                         "[drm] ring test on 0 succeeded in 4 usecs")),
    _r("amd_queue_map_failed", r"\bK[CG]Q (?:enable|disable) failed|failed to (?:remap|map) k?[cg]q|"
       r"failed to (?:map|unmap) (?:compute|gfx) queue|failed to halt cp gfx|Failed to lock KIQ|"
       r"fail(?:ed)? to wait on (?:gfx )?hqd deactiv|fail to remap queue|failed to (?:read|write) reg[: ]",
       "ring_timeout", W, "amd", "the driver could not map or unmap the hardware queues through the KIQ",
       "gpu_fault",
       'amdgpu/amdgpu_gfx.c: "KCQ enable failed\\n"',
       'amdgpu/amdgpu_gfx.c: "KGQ enable failed\\n"',
       'amdgpu/gfx_v11_0.c: "KCQ disable failed\\n"',
       'amdgpu/gfx_v11_0.c: "failed to remap kcq\\n"',
       'amdgpu/amdgpu_gfx.c: "failed to map compute queue\\n"',
       'amdgpu/gfx_v11_0.c: "failed to %s cp gfx\\n"',
       'amdgpu/amdgpu_gfx.c: "Failed to lock KIQ (%d).\\n"',
       'amdgpu/gfx_v11_0.c: "fail to wait on hqd deactivate\\n"',
       'amdgpu/gfx_v9_0.c: "fail to wait on hqd deactive\\n"',
       'amdgpu/mes_v11_0.c: "failed to wait on gfx hqd deactivate\\n"',
       'amdgpu/gfx_v9_0.c: "fail to remap queue\\n"',
       'amdgpu/amdgpu_gfx.c: "failed to read reg:%x\\n"',
       'amdgpu/amdgpu_gfx.c: "failed to write reg:%x\\n"',
       'amdgpu/amdgpu_mes.c: "failed to read reg (0x%x)\\n"',
       'amdgpu/amdgpu_mes.c: "failed to write reg (0x%x)\\n"',
       examples=(corpus("059-amd-kiq-ring-test-failed-kcq-disable-baco-reset.log",
                        "[drm:gfx_v8_0_hw_fini [amdgpu]] *ERROR* KCQ disable failed"),
                 corpus("060-amd-ring-reset-failed-mes-remove-queue-mode2.log",
                        "[drm:gfx_v11_0_cp_gfx_enable.isra.0 [amdgpu]] *ERROR* failed to halt cp gfx")),
       counter_examples=("[drm] kiq ring mec 3 pipe 1 q 0",
                         "amdgpu 0000:12:00.0: kiq ring mec 2 pipe 1 q 0")),
    _r("amd_preempt_failed",
       r"ring \d+ failed to (?:preempt ib|be preempted)|Timeout waiting for (?:VM flush ACK|sem acquire in VM flush)",
       "ring_timeout", W, "amd", "the GPU did not preempt a ring or acknowledge a VM flush in time", "gpu_fault",
       'amdgpu/gfx_v11_0.c: "ring %d failed to preempt ib\\n"',
       'amdgpu/sdma_v6_0.c: "ring %d failed to be preempted\\n"',
       'amdgpu/gmc_v9_0.c: "Timeout waiting for VM flush ACK!\\n"',
       'amdgpu/gmc_v9_0.c: "Timeout waiting for sem acquire in VM flush!\\n"',
       examples=(template(A + "ring 0 failed to preempt ib"),
                 template(A + "Timeout waiting for VM flush ACK!")),
       counter_examples=("amdgpu ffff:fe:1f.7: amdgpu: ring 0 preempted ib",)),
    _r("amd_illegal_command", r"Illegal (?:register access|opcode|instruction) in command stream",
       "ring_timeout", W, "amd", "a command stream did something illegal; its ring will be reset", "gpu_fault",
       'amdgpu/gfx_v11_0.c: "Illegal register access in command stream\\n"',
       'amdgpu/gfx_v11_0.c: "Illegal opcode in command stream \\n"',
       'amdgpu/gfx_v11_0.c: "Illegal instruction in command stream\\n"',
       examples=(corpus("069-amd-freebsd-illegal-reg-gfx-timeout-psp-unload-mode2.log",
                        "[drm ERROR :gfx_v9_0_priv_reg_irq] Illegal register access in command stream"),),
       counter_examples=("amdgpu ffff:fe:1f.7: amdgpu: Illegal register access",)),
    # --- AMD: resets --------------------------------------------------------------------------------
    _r("amd_reset_begin", r"GPU (?:reset|jobs stop) begin", "gpu_reset", W, "amd",
       "the driver started a full GPU reset; VRAM and contexts may be lost", "reset",
       'amdgpu/amdgpu_device.c: "GPU %s begin!\\n"',
       # (not 069's `drmn0: GPU reset begin!`: a line with nothing variable, heldout37's b03 holds it too)
       examples=(corpus("012-amd-ring-gfx-timeout-baco-reset2-succeeded.log",
                        "amdgpu 0000:08:00.0: amdgpu: GPU reset begin!"),),
       counter_examples=("vfio-pci 0000:0c:00.0: AMD_NAVI14: begin psp mode 1 reset",)),
    _r("amd_reset_mode12", r"\b(?i:mode[12]) reset\s*$|GPU (?:psp )?mode1 reset\s*$", "gpu_reset", W, "amd",
       "a full GPU reset (MODE1/MODE2) is running", "reset",
       'amdgpu/soc21.c: "MODE1 reset\\n"',
       'amdgpu/soc21.c: "MODE2 reset\\n"',
       'amdgpu/amdgpu_device.c: "GPU mode1 reset\\n"',
       'amdgpu/amdgpu_device.c: "GPU psp mode1 reset\\n"',
       examples=(corpus("069-amd-freebsd-illegal-reg-gfx-timeout-psp-unload-mode2.log", "drmn0: MODE2 reset"),
                 corpus("133-amd-vega20-gfx-timeout-kfd-evict-warn-dump-stack-mode1.log",
                        "amdgpu 0000:03:00.0: amdgpu: GPU psp mode1 reset")),
       counter_examples=("vfio-pci 0000:0c:00.0: AMD_NAVI14: mode1 reset succeeded",
                         "vfio-pci 0000:0c:00.0: AMD_NAVI14: MP1 reset")),
    _r("amd_reset_method", r"(?:GPU )?BACO reset\s*$|GPU (?:pci config )?reset\s*$", "gpu_reset", W, "amd",
       "a full GPU reset is running", "reset",
       'amdgpu/soc21.c: "BACO reset\\n"',
       'amdgpu/cik.c: "GPU pci config reset\\n"',
       examples=(corpus("016-amd-ring-reset-failed-then-full-reset.log", "amdgpu 0000:0c:00.0: BACO reset"),
                 corpus("091-amd-comp-ring-test-failed-reset-vce-suspend-failed-vram-lost.log",
                        "amdgpu 000d:31:00.0: GPU pci config reset")),
       counter_examples=("usb 1-3: reset full-speed USB device number 3 using xhci_hcd",
                         "vfio-pci 0000:0c:00.0: AMD_NAVI14: performing reset")),
    _r("amd_ring_reset_failed", r"\b(?:Ring \S+|\w+ queue) reset failed", "gpu_reset", W, "amd",
       "a per-ring reset failed; the driver escalates to a full reset", "reset",
       'amdgpu/amdgpu_job.c (Linux 6.15+): "Ring %s reset failed\\n"',
       examples=(corpus("016-amd-ring-reset-failed-then-full-reset.log",
                        "amdgpu 0000:0c:00.0: Ring gfx_0.0.0 reset failed"),
                 corpus("002-amd-sq-intr-then-mode2-reset.log", "amdgpu 0000:c1:00.0: amdgpu: VPE queue reset failed")),
       counter_examples=("amdgpu 0000:c2:00.0: Ring gfx_0.0.0 reset succeeded",)),
    _r("amd_reset_succeeded", r"GPU reset(?:\(\d+\))? succeeded|Ring \S+ reset succeeded", "gpu_reset", I, "amd",
       "the GPU reset succeeded", "reset",
       'amdgpu/amdgpu_device.c: "GPU reset(%d) succeeded!\\n"',
       'amdgpu/amdgpu_device.c: "GPU reset succeeded, trying to resume\\n"',
       'amdgpu/amdgpu_job.c (Linux 6.15+): "Ring %s reset succeeded\\n"',
       examples=(corpus("012-amd-ring-gfx-timeout-baco-reset2-succeeded.log",
                        "amdgpu 0000:08:00.0: amdgpu: GPU reset(2) succeeded!"),
                 corpus("013-amd-ring-gfx-timeout-per-ring-reset-llama-server.log",
                        "amdgpu 0000:c2:00.0: Ring gfx_0.0.0 reset succeeded")),
       counter_examples=("vfio-pci 0000:0c:00.0: AMD_NAVI14: mode1 reset succeeded",
                         "[drm] ring test on 0 succeeded in 4 usecs")),
    _r("amd_ring_reset_start", r"Starting \S+ ring reset", "gpu_reset", I, "amd",
       "the driver is resetting one ring", "reset",
       'amdgpu/amdgpu_job.c (Linux 6.15+): "Starting %s ring reset\\n"',
       examples=(corpus("013-amd-ring-gfx-timeout-per-ring-reset-llama-server.log",
                        "amdgpu 0000:c2:00.0: Starting gfx_0.0.0 ring reset"),),
       counter_examples=("amdgpu 0000:c2:00.0: Ring gfx_0.0.0 reset succeeded",)),
    _r("amd_vram_lost", r"VRAM is lost", "gpu_reset", W, "amd",
       "VRAM contents were lost in the reset: every GPU process must restart", "reset",
       'amdgpu/amdgpu_device.c: "VRAM is lost due to GPU reset!\\n"',
       examples=(corpus("012-amd-ring-gfx-timeout-baco-reset2-succeeded.log", "[drm] VRAM is lost due to GPU reset!"),),
       counter_examples=("[drm] Detected VRAM RAM=16368M, BAR=256M",)),
    _r("amd_suspend_failed", r"suspend of IP block <\w+> failed", "gpu_reset", W, "amd",
       "a GPU block failed to suspend before a reset or sleep", "reset",
       'amdgpu/amdgpu_device.c: "suspend of IP block <%s> failed %d\\n"',
       examples=(corpus("135-amd-suspend-smu-psp-failed-mode1-reset-failed.log",
                        "[drm:amdgpu_device_ip_suspend_phase2 [amdgpu]] *ERROR* suspend of IP block"
                        " <smu> failed -62"),),
       counter_examples=("amdgpu ffff:fe:1f.7: amdgpu: suspend of IP block <smu> done",)),
    # --- AMD: memory, RAS, SMU ----------------------------------------------------------------------
    _r("amd_page_fault", r"\[(?:gfx|mm)hub\d*\] (?:no-retry |retry )?(?:VMC )?page fault|\bVM fault \(0x|"
       r"\w+_L2_PROTECTION_FAULT_STATUS:|GPU fault detected: \d+|Can't handle page fault",
       "page_fault", W, "amd", "GPU page fault: a process touched unmapped GPU memory", "gpu_fault",
       'amdgpu/gmc_v9_0.c: "[%s] %s page fault (src_id:%u ring:%u vmid:%u pasid:%u)\\n"',
       'amdgpu/gmc_v9_0.c: "VM_L2_PROTECTION_FAULT_STATUS:0x%08X\\n"',
       'amdgpu/gfxhub_v2_0.c: "GCVM_L2_PROTECTION_FAULT_STATUS:0x%08X\\n"',
       'amdgpu/gmc_v8_0.c: "GPU fault detected: %d 0x%08x\\n"',
       'amdgpu/gmc_v8_0.c: "VM fault (0x%02x, vmid %d, pasid %d) at page %u, %s from \'%s\' (0x%08x) (%d)\\n"',
       'amdgpu/amdgpu_vm.c: "Can\'t handle page fault (%d)\\n"', process_follows=True,
       examples=(corpus("071-amd-freebsd-dm-fences-timeout-retry-page-faults.log",
                        "drmn0: VM_L2_PROTECTION_FAULT_STATUS:0x00341051"),
                 corpus("143-amd-gfx1151-no-retry-fault-process-on-own-line.log",  # its process: the next line
                        "amdgpu 0000:c6:00.0: amdgpu: [gfxhub0] no-retry page fault (src_id:0 ring:24 vmid:3"
                        " pasid:32769)"),
                 corpus("074-amd-legacy-gpu-fault-vm-context1-ih-overflow.log",
                        "amdgpu 0000:01:00.0: GPU fault detected: 146 0x07024414")),
       counter_examples=("[drm] PCIE GART of 512M enabled (table at 0x000000801FB00000).",
                         "amdgpu ffff:fe:1f.7: amdgpu: [gfxhub0] page table base 0x8000")),
    _r("amd_ras_uncorrectable",
       r"(?:\d+ new )?\b(?:uncorrectable|uncorrected) (?:hardware )?errors? ?(?:\(\w+\) )?(?:detected|occurred)|"
       r"\buncorrectable hardware error\(|RAS controller interrupt|(?:UVD VCPU state may lost due to RAS )?"
       r"ERREVENT_ATHUB_INTERRUPT|poison (?:is )?consumed|"
       r"RAS Intr triggered, device disabled|RAS records:\d+ exceed threshold",
       "ras_error", C, "amd", "uncorrectable hardware error (RAS)", "ras",
       'amdgpu/amdgpu_ras.c (RAS_EVENT_LOG): "uncorrectable hardware error(ERREVENT_ATHUB_INTERRUPT) detected!\\n"',
       'amdgpu/amdgpu_ras.c (RAS_EVENT_LOG): "%lld new uncorrectable hardware errors detected in %s block\\n"',
       'amdgpu/amdgpu_ras.c (RAS_EVENT_LOG, 6.10+): "socket: %d, die: %d, %lld new uncorrectable hardware errors'
       ' detected in %s block\\n"',
       'amdgpu/amdgpu_kms.c: "RAS Intr triggered, device disabled!!"',
       'amdgpu/amdgpu_ras_eeprom.c: "RAS records:%d exceed threshold:%d"',
       'amdgpu/amdgpu_ras_eeprom.c: "RAS records:%d exceed threshold:%d, GPU will not be initialized. Replace this'
       ' GPU or increase the threshold"',
       examples=(corpus("092-amd-mi50-ras-athub-uncorrectable-reset-powerplay-failed.log",
                        "amdgpu 0000:e3:00.0: amdgpu: uncorrectable hardware"
                        " error(ERREVENT_ATHUB_INTERRUPT) detected!"),
                 corpus("092-amd-mi50-ras-athub-uncorrectable-reset-powerplay-failed.log",
                        "[drm] UVD VCPU state may lost due to RAS ERREVENT_ATHUB_INTERRUPT"),
                 template(A + "{3}socket: 0, die: 1, 2 new uncorrectable hardware errors detected in umc block")),
       counter_examples=("amdgpu 0000:66:00.0: amdgpu: RAS: optional ras ta ucode is not available",
                         A + "{3}socket: 0, die: 1, 5 uncorrectable hardware errors detected in total in umc block",
                         "amdgpu ffff:fe:1f.7: amdgpu: 0 uncorrectable hardware errors so far")),
    _r("amd_cp_ecc", r"CP ECC ERROR IRQ", "ras_error", W, "amd", "the command processor reported an ECC error",
       "ras",
       'amdgpu/amdgpu_gfx.c: "CP ECC ERROR IRQ\\n"',
       examples=(template(A + "CP ECC ERROR IRQ"),),
       counter_examples=("amdgpu ffff:fe:1f.7: amdgpu: CP ECC enabled",)),
    _r("amd_sw_ctf", r"GPU over temperature range\(SW CTF\)|going to shutdown due to GPU SW CTF", "thermal", C,
       "amd", "the GPU passed its critical temperature; the system shuts down", "thermal",
       'pm/swsmu/amdgpu_smu.c: "ERROR: GPU over temperature range(SW CTF) detected!\\n"',
       'pm/swsmu/amdgpu_smu.c: "ERROR: System is going to shutdown due to GPU SW CTF!\\n"',
       examples=(template(A + "ERROR: GPU over temperature range(SW CTF) detected!"),),
       counter_examples=("amdgpu ffff:fe:1f.7: amdgpu: SW CTF threshold 118 C",)),
    _r("amd_ras_correctable", r"(?:\d+ new )?\bcorrectable (?:hardware )?errors? detected", "ras_error", I, "amd",
       "correctable hardware error (RAS)", "ras",
       'amdgpu/amdgpu_ras.c (RAS_EVENT_LOG): "%lld new correctable hardware errors detected in %s block\\n"',
       examples=(template(A + "3 new correctable hardware errors detected in umc block"),),
       counter_examples=("amdgpu ffff:fe:1f.7: amdgpu: correctable error counting enabled",)),
    _r("amd_psp_failure",
       r"PSP (?:load \w+(?: \w+)? failed|create ring failed|firmware loading failed|resume failed)|"
       r"psp gfx command \S+ failed",
       "smu_error", W, "amd", "the GPU's security processor firmware (PSP) failed a command", "gpu_fault",
       'amdgpu/amdgpu_psp.c: "PSP load kdb failed!\\n"',
       'amdgpu/amdgpu_psp.c: "PSP load sys drv failed!\\n"',
       'amdgpu/amdgpu_psp.c: "PSP load sos failed!\\n"',
       'amdgpu/amdgpu_psp.c: "PSP load tmr failed!\\n"',
       'amdgpu/amdgpu_psp.c: "PSP create ring failed!\\n"',
       'amdgpu/amdgpu_psp.c: "PSP firmware loading failed\\n"',
       'amdgpu/amdgpu_psp.c: "PSP resume failed\\n"',
       'amdgpu/amdgpu_psp.c: "psp gfx command %s(0x%X) failed and response status is (0x%X)\\n"',
       examples=(template(A + "psp gfx command LOAD_TA(0x1) failed and response status is (0x7)"),
                 template(A + "PSP create ring failed!")),
       counter_examples=("amdgpu ffff:fe:1f.7: amdgpu: PSP runtime database doesn't exist",
                         "[drm] psp gfx command LOAD_TA(0x1) done")),
    _r("amd_smu_failure", r"\bSMU\b.*(?:fail|timeout|[Tt]imed out|not done)|\bsmu_\w+.*(?:failed|timeout)|"
       r"SMC is not ready|\[powerplay\] .*[Ff]ailed|Failed to send message 0x|"
       r"\s*failed to send (?:pre )?message [0-9a-fA-F]+ ret is -?\d+|"
       r"SMU: (?:No response|I'm very busy|response:|unknown command|valid command, bad prerequisites|I'm debugging)|"
       r"Fail(?:ed)? to disable (?:dpm|smu) features|"
       r"Failed to \w+ (?:BACO state|gfxoff)!|\[PrepareMp1\] Failed|SMC failed to set mp1 state|"
       r"Fail(?:ed)? to \w+ [^\n]*\b(?:SMU|SMC|smu|metrics table|pptable|PPTable)\b",
       "smu_error", W, "amd", "the power-management firmware (SMU) failed a request", "gpu_fault",
       'pm/swsmu/smu_cmn.c: "SMU: I\'m not done with your previous command: SMN_C2PMSG_66:0x%08X'
       ' SMN_C2PMSG_82:0x%08X"',
       'pm/swsmu/amdgpu_smu.c: "SMC is not ready\\n"',
       'pm/swsmu/smu13/smu_v13_0_6_ppt.c: "Failed to export SMU metrics table!\\n"',
       'pm/powerplay/smumgr/smu9_smumgr.c: "Failed to send message 0x%x, response 0x%x\\n"',
       'pm/powerplay/smumgr/smu7_smumgr.c, ci_smumgr.c (before 5.x, pr_info: the message on a line of its own after'
       ' the prefix): "\\n failed to send message %x ret is %d \\n"',
       'pm/powerplay/smumgr/smu7_smumgr.c (before 5.x): "\\n failed to send pre message %x ret is %d \\n"',
       'pm/swsmu/smu_cmn.c (Linux 7.x, __smu_msg_v1_print_err_limited; its %s is "SMU: No response"):'
       ' "%s msg_reg: %x resp_reg: %x"',
       'pm/swsmu/smu_cmn.c: "SMU: I\'m very busy for your command: index:%d param:0x%08X message:%s"',
       'pm/swsmu/smu_cmn.c: "SMU: response:0x%08X for index:%d param:0x%08X message:%s?"',
       'pm/swsmu/smu_cmn.c: "SMU: unknown command: index:%d param:0x%08X message:%s"',
       'pm/swsmu/smu_cmn.c: "SMU: valid command, bad prerequisites: index:%d param:0x%08X message:%s"',
       'pm/swsmu/smu_cmn.c: "SMU: I\'m debugging!"',
       'pm/swsmu/amdgpu_smu.c: "Fail to disable dpm features!\\n"',
       'pm/swsmu/amdgpu_smu.c: "Failed to disable smu features.\\n"',
       'pm/swsmu/amdgpu_smu.c: "Failed to disable smu features except BACO.\\n"',
       'pm/swsmu/amdgpu_smu.c: "Failed to %s BACO state!\\n"',
       'pm/swsmu/amdgpu_smu.c: "Failed to %s gfxoff!\\n"',
       'pm/swsmu/smu_cmn.c: "[PrepareMp1] Failed!\\n"',
       'amdgpu/amdgpu_device.c: "SMC failed to set mp1 state %d, %d\\n"',
       examples=(corpus("087-amd-mi100-runtime-pm-smu-resume-failed.log",
                        "amdgpu 0000:03:00.0: amdgpu: SMC is not ready"),
                 corpus("092-amd-mi50-ras-athub-uncorrectable-reset-powerplay-failed.log",
                        "amdgpu: [powerplay] Failed to set soft min gfxclk !"),
                 template("amdgpu ffff:fe:1f.7: SMU: No response msg_reg: 6 resp_reg: 0"),
                 # one record: the format's own newline follows the prefix (dmesg shows it indented)
                 template("amdgpu: [powerplay] \n failed to send message 12f ret is 0 ")),
       counter_examples=("amdgpu 0000:66:00.0: amdgpu: SMU is initialized successfully!",
                         "amdgpu 0000:83:00.0: amdgpu: SMU driver if version not matched",
                         "amdgpu: [powerplay] \n message 146 sent")),
    # --- PCIe AER (drivers/pci/pcie) and APEI/GHES -------------------------------------------------
    _r("aer_no_callback", r"AER: can't recover \(no error_detected callback\)|device has no AER-aware driver",
       "pcie_aer", W, "pcie", "a device on a failing PCIe link has no error recovery", "aer",
       'pci/pcie/err.c: "can\'t recover (no error_detected callback)\\n"',
       'pci/pcie/err.c (before 5.x): "device has no AER-aware driver\\n"', quiet=True,
       examples=(corpus("149-aer-nonfatal-ahci-no-callback-recovery-failed-rpi5.log",
                        "ahci 0000:01:00.0: AER: can't recover (no error_detected callback)"),
                 corpus("007-amd-pcie-aer-uncorrected-fatal-malformed-tlp.log",
                        "amdgpu 0000:06:00.0: device has no AER-aware driver")),
       counter_examples=("pcieport 0000:00:01.1: AER: aer_layer=Data Link Layer, aer_agent=Receiver ID",)),
    _r("aer_recovery_failed", r"AER: [Dd]evice recovery failed", "pcie_aer", W, "pcie",
       "PCIe error recovery failed: the devices behind this port may be lost", "aer",
       'pci/pcie/err.c: "device recovery failed\\n"',
       examples=(corpus("007-amd-pcie-aer-uncorrected-fatal-malformed-tlp.log",
                        "pcieport 0000:00:1c.4: AER: Device recovery failed"),),
       counter_examples=("pcieport ffff:fe:1f.7: AER: device recovery successful",)),
    _r("aer_fatal", r"(?:PCIe Bus Error: severity=|Multiple )?Uncorrect(?:ed|able) \(Fatal\)|containment event",
       "pcie_aer", C, "pcie",
       "fatal uncorrected PCIe error", "aer",
       'pci/pcie/aer.c: "PCIe Bus Error: severity=%s, type=%s, (%s)\\n" with "Uncorrectable (Fatal)"',
       'pci/pcie/dpc.c: "containment event, status:%#06x source:%#06x\\n"',
       examples=(corpus("007-amd-pcie-aer-uncorrected-fatal-malformed-tlp.log",
                        "pcieport 0000:00:1c.4: AER: Uncorrected (Fatal) error received: id=00e4"),),
       counter_examples=("pcieport 0000:80:1b.4: AER: Uncorrectable (Non-Fatal) error message"
                         " received from 0000:80:1b.4",)),
    _r("aer_nonfatal", r"(?:PCIe Bus Error: severity=|Multiple )?Uncorrect(?:ed|able) \(Non-Fatal\)",
       "pcie_aer", W, "pcie",
       "uncorrected, non-fatal PCIe error", "aer",
       'pci/pcie/aer.c: "%s%s error message received from %04x:%02x:%02x.%d\\n" with "Uncorrectable (Non-Fatal)"',
       examples=(corpus("148-aer-nonfatal-no-callback-recovery-failed-xhci-thunderbolt.log",
                        "pcieport 0000:80:1b.4: AER: Uncorrectable (Non-Fatal) error message"
                        " received from 0000:80:1b.4"),),
       counter_examples=("pcieport 0000:00:1c.4: AER: Uncorrected (Fatal) error received: id=00e4",)),
    _r("aer_corrected", r"(?:Multiple )?Correct(?:ed|able) error|(?:PCIe Bus Error: )?severity=Correct(?:ed|able)",
       "pcie_aer", I, "pcie", "corrected PCIe error (the link retried)", "aer",
       'pci/pcie/aer.c: "%s%s error message received from %04x:%02x:%02x.%d\\n" with "Correctable"',
       'pci/pcie/aer.c: "PCIe Bus Error: severity=%s, type=%s, (%s)\\n" with "Correctable"',
       examples=(corpus("151-benign-aer-multiple-corrected-id-mining-rig-syslog.log",
                        "pcieport 0000:00:1d.1: AER: Multiple Corrected error received: id=00e9"),
                 corpus("008-benign-pcie-aer-correctable-timeout-during-amdgpu-init.log",
                        "pcieport 0000:00:03.0: PCIe Bus Error: severity=Correctable, type=Data Link"
                        " Layer, (Transmitter ID)")),
       counter_examples=("pcieport 0000:00:01.1: AER: aer_layer=Data Link Layer, aer_agent=Receiver ID",
                         "pcieport 0000:00:03.1:   device [1022:1453] error status/mask=00001000/00006000")),
)



def configured(disabled: Iterable[str] = (), severities: Mapping[str, Severity] | None = None) -> tuple[Rule, ...]:
    """The built-in rules without those `disabled`, with their severity set by name where the config says so
    (a correlation may still raise it; `[kernel.severity]` by kind still has the last word)."""
    severities, disabled = severities or {}, set(disabled)
    return tuple(replace(r, severity=severities[r.name]) if r.name in severities else r
                 for r in RULES if r.name not in disabled)


@plain
class ProcessFormat:
    """How a driver names the process a fault belongs to: in the fault's own line, or in the line right after it
    (for a rule with `process_follows`). Groups: `pid` (absent: the driver knew no process) and `name`. Names are
    a task's comm (at most 15 characters, chosen by whoever runs the task): the expressions bound them and anchor
    the pid between the driver's fixed words, so that a process name cannot pass for another pid."""

    name: str
    pattern: str
    sources: tuple[str, ...]
    examples: tuple[tuple[Example, int, str], ...]  # a line, the pid and the name it names (0: no process)


_COMM = r".{0,15}"
PROCESS_FORMATS: tuple[ProcessFormat, ...] = (
    ProcessFormat(
        "amd_task_info",
        rf"(?:Process information: process|Process info: process|for process|: +Process) (?P<name>{_COMM}) "
        rf"(?:pid|tid) (?P<pid>\d+) thread {_COMM} pid \d+\)?\s*$",
        ('amdgpu/gmc_v9_0.c, gmc_v10_0.c, gmc_v11_0.c (before about Linux 6.10, in the fault line): "[%s] %s page fault'
         ' (src_id:%u ring:%u vmid:%u pasid:%u, for process %s pid %d thread %s pid %d)\\n"',
         'amdgpu/gmc_v9_0.c, gmc_v10_0.c, gmc_v11_0.c (from about Linux 6.10, the next line):'
         ' " for process %s pid %d thread %s pid %d)\\n"',
         'amdgpu/amdgpu_job.c (until 2025, the line after "ring %s timeout"): "Process information: process %s pid %d'
         ' thread %s pid %d\\n"',
         'amdgpu/amdgpu_vm.c amdgpu_vm_print_task_info (2025 kernels, the line after a page fault or a ring timeout):'
         ' " Process %s pid %d thread %s pid %d\\n"',
         'amdkfd/kfd_events.c (a 2024 patch, queue hang detection): "Process info: process %s tid %d thread %s'
         ' pid %d\\n"'),
        ((corpus("012-amd-ring-gfx-timeout-baco-reset2-succeeded.log",
                 "[drm:amdgpu_job_timedout [amdgpu]] *ERROR* Process information: process cosmic-comp pid 3503"
                 " thread cosmic-com:cs0 pid 3539"), 3503, "cosmic-comp"),
         (corpus("143-amd-gfx1151-no-retry-fault-process-on-own-line.log",
                 "amdgpu 0000:c6:00.0: amdgpu:  for process pt_main_thread pid 12924 thread pt_main_thread pid"
                 " 12924)"), 12924, "pt_main_thread"),
         (corpus("004-amd-gfxhub-page-fault-mi210.log",
                 "amdgpu 0000:25:00.0: amdgpu: [gfxhub0] no-retry page fault (src_id:0 ring:144 vmid:3 pasid:32769,"
                 " for process pt_main_thread pid 2919831 thread pt_main_thread pid 2919831)"), 2919831,
          "pt_main_thread"),
         (corpus("069-amd-freebsd-illegal-reg-gfx-timeout-psp-unload-mode2.log",
                 "drmn0: Process information: process  pid 167175 thread  pid 167175"), 167175, ""),
         (corpus("116-amd-sdma0-timeout-mode2-reset-resume-no-stamps.log",
                 "[drm:amdgpu_job_timedout [amdgpu]] *ERROR* Process information: process  pid 0 thread  pid 0"),
          0, ""),
         (template(A + " Process vllm pid 4242 thread vllm pid 4250"), 4242, "vllm"),
         (template("[drm] *ERROR* Process info: process python3 tid 4242 thread python3 pid 4250"), 4242,
          "python3"),
         # a name made to look like the format still names its own pid, not the one it spells
         (template(A + " Process a pid 9 thread  pid 4242 thread a pid 4243"), 4242, "a pid 9 thread "))),
    ProcessFormat(
        "nv_xid_process",
        rf"Xid \(PCI:[^)]*\): \d+, (?:pid=(?P<pid>\d+)|pid='<unknown>'), +name=(?P<name>{_COMM}?)(?:, |$)",
        ('nvidia/src/kernel (nvErrorLog): "Xid (PCI:%s): %u, pid=%d, name=%s, %s" in the Xid line; the pid is'
         ' \'<unknown>\' when the driver raised it outside any process (drivers before 4xx printed no pid)',),
        ((corpus("020-nv-xid-13-and-43-sm-exceptions.log",
                 "NVRM: Xid (PCI:0000:38:00): 43, pid=2924364, name=pt_main_thread, Ch 00000008"), 2924364,
          "pt_main_thread"),
         (corpus("124-nv-xid-109-syslog-without-host-or-ident.log",
                 "NVRM: Xid (PCI:0000:02:00): 109, pid=8494,   name=RenderThread, channel 0x0000000d, CTX SWITCH"
                 " TIMEOUT, Info 0x14c011"), 8494, "RenderThread"),
         (corpus("122-nv-xid-31-mmu-fault-62-halt-45-cleanup.log",
                 "NVRM: Xid (PCI:0000:0a:00): 45, pid='<unknown>', name=<unknown>, Ch 00000008"), 0, "<unknown>"))),
)


# APEI/GHES records (drivers/firmware/efi/cper.c: "%sevent severity: %s\n", "%s section_type: %s\n"): the
# record's `{N}` id ties its severity line to its section line; a PCIe section is a pcie_aer event of that
# severity. Rule name and provenance for the evidence:
GHES_RECORD = r"^\{(?P<id>\d+)\}\[Hardware Error\]:"
GHES_SEVERITY = r"event severity: (?P<severity>corrected|recoverable|fatal|info)"
GHES_PCIE = r"section_type: PCIe error"
GHES_SEVERITIES = {"corrected": I, "info": I, "recoverable": W, "fatal": C}
GHES_RULE = Rule("ghes_pcie", GHES_PCIE, "pcie_aer", I, "pcie", "PCIe error reported by firmware (APEI/GHES)", "aer",
                 ('firmware/efi/cper.c: "%sevent severity: %s\\n"', 'firmware/efi/cper.c: "%ssection_type: %s\\n"'))

# Lines that open a kernel oops report, with their severity. Searched at the start of the text or after a
# `prefix: ` (e.g. "watchdog: BUG: soft lockup"); sources: arch/x86/mm/fault.c, arch/x86/kernel/dumpstack.c,
# kernel/panic.c, lib/bug.c, kernel/watchdog.c, kernel/hung_task.c, arch/mips/mm/fault.c.
OOPS_HEADERS: tuple[tuple[str, Severity], ...] = (
    (r"^(?:\S+: )?(?:BUG: |kernel BUG at |Oops(?::|\[#\d+\])|Kernel panic - not syncing|general protection fault|"
     r"invalid (?:opcode|operand): |Unable to handle kernel )|^CPU \d+ Unable to handle kernel ", C),
    (r"^WARNING: (?:CPU: \d+ PID: \d+ )?at |^-+\[ cut here \]-+$|^INFO: task \S+ blocked for more than", W),
)
OOPS_END = r"---\[ end (?:trace|Kernel panic)"
OOPS_HINTS = ("+0x", "BUG", "Oops", "panic", "general protection", "Unable to handle", "WARNING: ", "cut here",
              "end trace", "end Kernel panic", "invalid op", "blocked for more than", "Modules linked in: ")
# The module of a stack frame `func+0x12/0x60 [module]` (`[module buildid]` since 5.x), in `RIP:`, `IP:` and trace
# lines (a frame of the core kernel names none).
MODULE_FRAME = r"\+0x[0-9a-f]+/0x[0-9a-f]+ \[(\w+)(?: [0-9a-f]+)?\]"
# A line of a stack trace (x86 RIP/IP and frames, old `[<addr>]` frames, MIPS/RISC-V epc/ra): only such a line
# opens a report without a header, so `returns -22` lines naming `amdgpu_pmops_suspend+0x0/0x40 [amdgpu]` do not.
TRACE_LINE = (r"^\s*(?:\? |RIP: [0-9a-f]{4}:|IP: (?:\[<[0-9a-f]+>\] )?|\(?\[<[0-9a-f]+>\] (?:\? )?|"
              r"(?:epc|ra)\s*: [0-9a-f]+ )?[\w.]+\+0x[0-9a-f]+/0x[0-9a-f]+")
# A trace without a BUG/WARNING header whose frames pass through dump_stack was printed on purpose by a driver
# (NVRM's os_dump_stack in a GSP timeout report, amdgpu debug dumps): not an oops.
DUMP_STACK_FRAME = r"\bdump_stack(?:_lvl)?\+0x"
GSP_FRAME = r"\b_?kgsp\w+\+0x[0-9a-f]+/0x[0-9a-f]+ \[nvidia"
GPU_MODULES = frozenset({"amdgpu", "amdkfd", "amdxcp", "radeon", "nvidia", "nvidia_uvm", "nvidia_drm",
                         "nvidia_modeset", "nouveau", "i915", "xe"})
GPU_DRIVERS = frozenset({"amdgpu", "radeon", "nvidia", "nouveau", "i915", "xe"})
# the rules' vendors that are GPUs' (a "pcie" rule is a port's): their lines name a GPU, or the last one their
# driver named (kernel/classifier.py)
GPU_VENDORS = frozenset({"amd", "nvidia"})
# The DRM core's modules (drivers/gpu/drm/*.c, scheduler, TTM, helpers): a WARNING there, with a GPU driver in the
# report's `Modules linked in:`, is the GPU stack's (a driver's misuse of the core, or the core on its behalf).
DRM_CORE_MODULES = frozenset({"drm", "drm_kms_helper", "drm_display_helper", "drm_ttm_helper", "ttm", "gpu_sched",
                              "drm_buddy", "drm_exec", "drm_suballoc_helper"})
# lib/bug.c __warn: "WARNING: CPU: %d PID: %d at %pS" (before 6.x: "at %s:%d %pS"): the file is the DRM core's
DRM_CORE_WARNING = (r"^WARNING: CPU: \d+ PID: \d+ at "
                    r"(?:drivers/gpu/drm/[\w.-]+\.c:|[\w.]+\+0x[0-9a-f]+/0x[0-9a-f]+ \[drm)")
MODULES_LINE = "Modules linked in: "  # kernel/module/main.c print_modules: "Modules linked in:" " %s%s" ...
HUNG_TASK = r"^INFO: task \S+ blocked for more than"  # kernel/hung_task.c: "INFO: task %s:%d blocked for more than"
# A task hung this soon after a GPU driver's fault line (any Xid, an Xid 45 cleanup too) is the GPU's even when no
# GPU frame is in its trace (the trace is cut, or the task waits on a GPU process's teardown): hung_task_timeout_secs
# (120 by default), up to another timeout until the check sees it, and the time the task took to block.
HUNG_AFTER_GPU_FAULT = 300.0
# amdgpu resets the GPU as it starts it (soc15/nv "MODE2 reset" during amdgpu_device_init on APUs, and on resume):
# a MODE1/MODE2 reset (BOOT_RESETS) with no fault of that GPU before it within this many seconds is that (info),
# not a recovery.
BOOT_RESETS = frozenset({"amd_reset_mode12"})
RESET_AFTER_FAULT = 120.0


@plain
class Correlation:
    """A line of a `then` rule within `within_seconds` of a line of an `after` rule on the same GPU (or one of
    the two names no GPU). With `emit`, a new event of that kind and `severity` stands for the outcome (once
    per GPU and window); without, the `then` event's severity rises to `severity`. `either_order` lets the
    `then` line come first (the driver prints a reset's own test failure before or after its reset lines).
    `needs_gpu`: only when one of the two lines names a GPU (a USB controller that cannot recover is not ours)."""

    name: str
    after: tuple[str, ...]
    then: tuple[str, ...]
    within_seconds: float
    severity: Severity
    why: str
    emit: str | None = None
    either_order: bool = False
    runbook: str = ""
    needs_gpu: bool = False


_RESET_LINES = ("amd_reset_begin", "amd_reset_mode12", "amd_reset_method", "amd_reset_succeeded")
CORRELATIONS: tuple[Correlation, ...] = (
    Correlation("wave_errors_then_reset", ("amd_sq_intr",), _RESET_LINES, 120.0, C,
                "a reset right after shader wave errors: the pattern that precedes a lost GPU"),
    Correlation("failed_ring_reset_to_full_reset", ("amd_ring_reset_failed",), ("amd_reset_mode12",), 60.0, C,
                "a failed per-ring reset fell back to a full MODE1/MODE2 reset of the whole GPU"),
    Correlation("reset_with_failing_ring_tests", ("amd_ring_test_failed",), _RESET_LINES, 60.0, C,
                "the GPU's own ring/IB self-tests failed inside its reset: the reset did not bring the GPU back",
                emit="reset_failed", either_order=True, runbook="device_lost"),
    Correlation("xid_after_gsp_failure", ("nv_gsp_timeout",), ("nv_xid",), 60.0, C,
                "an Xid after the GPU's GSP firmware crashed or stopped answering: the GPU needs a reset"),
    Correlation("gpu_without_aer_recovery", ("aer_no_callback",), ("aer_recovery_failed",), 10.0, C,
                "PCIe error recovery failed and the GPU's driver cannot recover: the GPU is lost",
                emit="device_lost", either_order=True, runbook="device_lost", needs_gpu=True),
)
register_rules(RULES)  # config checks rule names against these (registry.py)
