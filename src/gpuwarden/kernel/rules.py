"""The kernel-line rule catalog, as data, derived from the drivers' own message templates.

Each rule: a name, a regular expression searched in the message text (the part after any timestamp,
`host kernel:` or `<N>` printk-level prefix), the event kind and severity, the vendor, what the line means,
a runbook key, the literal hints of which every match holds one, and its provenance: the source files and
format strings the expression was written from. Paths are in the Linux tree (`amdgpu/` is
drivers/gpu/drm/amd/amdgpu, `amdkfd/` and `pm/` likewise), the PCI and firmware cores (`pci/`, `firmware/`,
`acpi/`), or NVIDIA/open-gpu-kernel-modules (`nvidia/`, `kernel-open/`). tests/data/amdgpu-templates.json pins
the amdgpu error templates; tests/unit/test_templates.py checks each is classified or ignored with a reason.

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
    sources: tuple[str, ...] = ()  # "file: format string" the pattern was written from
    quiet: bool = False  # a line inside another report: it feeds correlations but makes no event of its own


def _r(name, pattern, kind, severity, vendor, meaning, runbook, hints, *sources, quiet=False) -> Rule:
    return Rule(name, pattern, kind, severity, vendor, meaning, runbook, tuple(hints.split("|")), sources, quiet)


RULES: tuple[Rule, ...] = (
    # --- NVIDIA -------------------------------------------------------------------------------------
    _r("nv_xid", r"NVRM: Xid \(PCI:[0-9a-fA-F:.]+(?: [^)]*)?\): (?P<xid>\d+)", "xid", W, "nvidia",
       "NVIDIA Xid error", "xid",
       "NVRM: Xid",
       'kernel-open/nvidia/nv-tracepoint.h: "Xid (PCI:%s): %u, %s"',
       'nvidia/src/kernel/gpu/rc/kernel_rc.c: " caused by previous Xid %d"'),
    _r("nv_fallen_off_bus", r"fallen off\s+(?:NVRM:\s+)?the bus", "device_lost", C, "nvidia",
       "the GPU fell off the PCIe bus and does not answer", "device_lost",
       "fallen off",
       'nvidia/arch/nvalloc/unix/src/osinit.c: "GPU has fallen off the bus.\\n"',
       'nvidia/arch/nvalloc/unix/src/osapi.c: "NVRM: fallen off the bus and is not responding to commands.\\n"'),
    _r("nv_gsp_timeout",
       r"of waiting for RPC response from GPU\d* GSP|GSP RM heartbeat timed out|_kgspIsHeartbeatTimedOut: Heartbeat"
       r" timed out|\*+ GSP Timeout \*+|RPC (?:event )?history \(CPU [<-]|GSP-CrashCat Report|"
       r"kflcnCoreDump\w*: |Memory Subsystem Error detected",
       "gsp_error", C, "nvidia", "the GPU's GSP firmware stopped answering or crashed", "gsp",
       "RPC response|heartbeat timed out|Heartbeat timed out|GSP Timeout|history (CPU|GSP-CrashCat|kflcnCoreDump|"
       "Memory Subsystem Error",
       'nvidia/src/kernel/gpu/gsp/kernel_gsp.c: "Timeout after %llus of waiting for RPC response from GPU%d GSP!'
       ' Expected function %d (%s) sequence %u (0x%llx 0x%llx)."',
       'nvidia/src/kernel/gpu/gsp/kernel_gsp.c: "GSP RM heartbeat timed out\\n"',
       'nvidia/src/kernel/gpu/gsp/kernel_gsp.c: "Heartbeat timed out, currentTimeMs %u heartbeat %u'
       ' heartbeatWithOffsetMs %u diff %u timeout %u\\n"',
       'nvidia/src/kernel/gpu/gsp/kernel_gsp.c: "***... GSP Timeout ...***\\n"',
       'nvidia/src/kernel/gpu/gsp/kernel_gsp.c: "GPU%d RPC history (CPU -> GSP):\\n"',
       'nvidia/src/kernel/gpu/gsp/kernel_gsp.c: "GPU%d RPC event history (CPU <- GSP):\\n"',
       'nvidia/src/kernel/gpu/gsp/arch/turing/kernel_gsp_tu102.c: "***... GSP-CrashCat Report ...***\\n"',
       'nvidia/src/kernel/gpu/falcon/kernel_falcon.c: "TRACE: %02u = 0x%016llx\\n"',
       'nvidia/src/kernel/gpu/mmu/kern_gmmu.c: "Memory Subsystem Error detected. kbusSendSysmembarSingle failed.\\n"'),
    _r("nv_init_failed", r"RmInitAdapter failed|rm_init_adapter failed|NVIDIA probe routine failed|"
       r"Cannot initialize GSP firmware RM|unexpected WPR2 already up",
       "gpu_missing", C, "nvidia", "the NVIDIA driver could not initialise a GPU", "device_lost",
       "RmInitAdapter|rm_init_adapter|probe routine failed|Cannot initialize GSP|WPR2 already up",
       'nvidia/arch/nvalloc/unix/src/osinit.c: "RmInitAdapter failed! (0x%x:0x%x:%d)\\n"',
       'kernel-open/nvidia/nv.c: "rm_init_adapter failed, device minor number %d\\n"',
       'kernel-open/nvidia/nv.c: "NVRM: The NVIDIA probe routine failed for %d device(s).\\n"',
       'nvidia/arch/nvalloc/unix/src/osinit.c: "RmInitAdapter: Cannot initialize GSP firmware RM\\n"',
       'nvidia/src/kernel/gpu/gsp/kernel_gsp.c: "unexpected WPR2 already up, cannot proceed with booting GSP\\n"'),
    # --- AMD: failed recovery and lost devices (before the generic reset rules) ---------------------
    _r("amd_device_lost", r"device lost from bus!", "device_lost", C, "amd",
       "the GPU fell off the PCIe bus", "device_lost",
       "device lost from bus!",
       'amdgpu/amdgpu_device.c: "device lost from bus!"'),
    _r("amd_recovery_failed", r"GPU Recovery Failed: ?-?\d+|GPU recovery failed|GPU reset(?:\(\d+\))? failed|"
       r"GPU reset end with ret = -\d+|ASIC reset failed|(?i:mode[12]|baco) reset failed|PCIe error recovery failed|"
       r"pre asic reset failed",
       "reset_failed", C, "amd",
       "the driver's full GPU reset failed: the GPU is unusable until a reboot", "device_lost",
       "Recovery Failed|recovery failed|GPU reset|ASIC reset failed|reset failed",
       'amdgpu/amdgpu_job.c: "GPU Recovery Failed: %d\\n"',
       'amdgpu/amdgpu_device.c: "GPU reset(%d) failed\\n"',
       'amdgpu/amdgpu_device.c: "GPU reset end with ret = %d\\n"',
       'amdgpu/amdgpu_device.c: "ASIC reset failed with error, %d for drm dev, %s"',
       'amdgpu/amdgpu_device.c: "GPU mode1 reset failed\\n"',
       'amdgpu/amdgpu_device.c: "PCIe error recovery failed, err:%d"',
       'amdgpu/amdgpu_device.c: "GPU pre asic reset failed with err, %d for drm dev, %s "'),
    _r("amd_smu_resume_failed", r"resume of IP block <smu> failed|SMC engine is not correctly up",
       "smu_error", C, "amd", "the power-management firmware (SMU) did not come back: the GPU is unusable",
       "device_lost",
       "IP block <smu>|SMC engine",
       'amdgpu/amdgpu_device.c: "resume of IP block <%s> failed %d\\n"',
       'pm/swsmu/amdgpu_smu.c: "SMC engine is not correctly up!\\n"'),
    _r("amd_resume_failed", r"resume of IP block <\w+> failed|amdgpu_device_ip_resume failed",
       "reset_failed", C, "amd", "a GPU block failed to resume after a reset or sleep: the GPU is unusable",
       "device_lost",
       "resume of IP block|ip_resume failed",
       'amdgpu/amdgpu_device.c: "resume of IP block <%s> failed %d\\n"',
       'amdgpu/amdgpu_device.c: "amdgpu_device_ip_resume failed (%d).\\n"'),
    _r("amd_init_failed",
       r"(?:hw_init|sw_init|early_init|late_init) of IP block <\w+> failed|amdgpu_device_ip_(?:late_)?init failed|"
       r"Fatal error during GPU init|amdgpu asic init failed|asic reset on init failed|gpu post error!",
       "gpu_missing", C, "amd", "the amdgpu driver could not initialise the GPU", "device_lost",
       "of IP block|ip_init failed|Fatal error during GPU init|asic init failed|reset on init failed|post error",
       'amdgpu/amdgpu_device.c: "hw_init of IP block <%s> failed %d\\n"',
       'amdgpu/amdgpu_device.c: "sw_init of IP block <%s> failed %d\\n"',
       'amdgpu/amdgpu_device.c: "early_init of IP block <%s> failed %d\\n"',
       'amdgpu/amdgpu_device.c: "late_init of IP block <%s> failed %d\\n"',
       'amdgpu/amdgpu_device.c: "amdgpu_device_ip_late_init failed\\n"',
       'amdgpu/amdgpu_device.c: "amdgpu_device_ip_init failed\\n"',
       'amdgpu/amdgpu_kms.c: "Fatal error during GPU init\\n"',
       'amdgpu/amdgpu_device.c: "amdgpu asic init failed\\n"',
       'amdgpu/amdgpu_device.c: "asic reset on init failed\\n"',
       'amdgpu/amdgpu_device.c: "gpu post error!\\n"'),
    _r("amd_wedged_recovered", r"device wedged, but recovered through reset", "gpu_reset", I, "amd",
       "the GPU hung and a reset recovered it", "reset",
       "device wedged",
       'drm/drm_drv.c: "device wedged, %s\\n"'),
    _r("amd_wedged", r"device wedged", "gpu_wedged", C, "amd",
       "the GPU is wedged and needs recovery", "device_lost",
       "device wedged",
       'drm/drm_drv.c: "device wedged, %s\\n"'),
    # --- AMD: hangs --------------------------------------------------------------------------------
    _r("amd_sq_intr", r"\bsq_intr: error", "sq_intr", W, "amd",
       "shader wave error interrupt (SQ): a kernel on the GPU faulted", "gpu_fault",
       "sq_intr",
       'amdkfd/kfd_int_process_v9.c: "sq_intr: error, se %d, data 0x%x, sh %d, priv %d, wave_id %d,'
       ' simd_id %d, cu_id %d, err_type %d\\n"',
       'amdkfd/kfd_int_process_v10.c: "sq_intr: error, se %d, data 0x%x, sa %d, priv %d, wave_id %d,'
       ' simd_id %d, wgp_id %d, err_type %d\\n"',
       'amdkfd/kfd_int_process_v11.c: "sq_intr: error, detail 0x%08x, type %d, sh %d, priv %d, wave_id %d,'
       ' simd_id %d, wgp_id %d\\n"'),
    _r("amd_ring_timeout", r"\bring \S+ timeout", "ring_timeout", W, "amd",
       "a GPU ring stopped completing jobs (job timeout)", "gpu_fault",
       "timeout",
       'amdgpu/amdgpu_job.c: "ring %s timeout, signaled seq=%u, emitted seq=%u\\n"',
       'amdgpu/amdgpu_job.c: "ring %s timeout, but soft recovered\\n"'),
    _r("amd_mes_no_response", r"MES failed to respon", "ring_timeout", C, "amd",
       "the micro-engine scheduler firmware stopped answering", "gpu_fault",
       "MES failed to respon",
       'amdgpu/mes_v11_0.c: "MES failed to respond to msg=%s\\n"',
       'amdgpu/mes_v11_0.c: "MES failed to respond to msg=%d\\n"'),
    _r("amd_mes_failed", r"failed to \w+ hardware queue (?:from|to) MES|MES might be in unrecoverable state|"
       r"failed to (?:unmap|map|reset) legacy queue|failed to (?:remove|reset) hardware queue|"
       r"failed to (?:suspend|resume) all gangs|MES is busy|MES ring buffer is full",
       "ring_timeout", W, "amd", "the micro-engine scheduler failed a queue operation", "gpu_fault",
       "hardware queue|MES might be|legacy queue|all gangs|MES is busy|MES ring buffer",
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
       'amdgpu/mes_v11_0.c: "MES ring buffer is full.\\n"'),
    _r("amd_kfd_preempt", r"qcm fence wait loop timeout|unsuccessful queues preemption|"
       r"queue preemption time ?out|Failed to evict (?:process )?queue|Failed to quiesce KFD|"
       r"Failed to restore (?:process )?queues", "ring_timeout", W, "amd",
       "KFD could not preempt the compute queues", "gpu_fault",
       "qcm fence|preemption|Failed to evict|Failed to quiesce|Failed to restore",
       'amdkfd/kfd_device_queue_manager.c: "qcm fence wait loop timeout expired\\n"',
       'amdkfd/kfd_device_queue_manager.c: "The cp might be in an unrecoverable state due to an unsuccessful'
       ' queues preemption\\n"',
       'amdkfd/kfd_process.c: "Failed to evict process queues\\n"',
       'amdgpu/amdgpu_amdkfd_gpuvm.c: "Failed to quiesce KFD\\n"'),
    _r("amd_ip_hung", r"IP block:\S+ is hung", "ring_timeout", W, "amd",
       "a GPU IP block is hung", "gpu_fault",
       "is hung",
       'amdgpu/amdgpu_device.c: "IP block:%s is hung!\\n"'),
    _r("amd_ring_test_failed", r"\bring \S+ (?:ib )?test failed|\bIB test (?:failed|timed out)|\bib ring test failed",
       "ring_timeout", C, "amd", "a GPU ring failed its self-test: the ring cannot run jobs", "device_lost",
       "test failed|IB test timed out",
       'amdgpu/amdgpu_ring.c: "ring %s test failed (%d)\\n"',
       'amdgpu/amdgpu_mes.c: "ring %s ib test failed (%d)\\n"',
       'amdgpu/amdgpu_ib.c: "IB test failed on %s (%d).\\n"',
       'amdgpu/amdgpu_device.c: "ib ring test failed (%d).\\n"',
       'amdgpu/sdma_v6_0.c: "amdgpu: IB test timed out\\n"'),
    _r("amd_queue_map_failed", r"\bK[CG]Q (?:enable|disable) failed|failed to (?:remap|map) k?[cg]q|"
       r"failed to (?:map|unmap) (?:compute|gfx) queue|failed to halt cp gfx|Failed to lock KIQ|"
       r"fail(?:ed)? to wait on (?:gfx )?hqd deactiv|fail to remap queue|failed to (?:read|write) reg[: ]",
       "ring_timeout", W, "amd", "the driver could not map or unmap the hardware queues through the KIQ",
       "gpu_fault",
       "Q enable failed|Q disable failed|failed to remap|failed to map|failed to unmap|failed to halt cp|"
       "Failed to lock KIQ|hqd deactiv|remap queue|failed to read reg|failed to write reg",
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
       'amdgpu/amdgpu_mes.c: "failed to write reg (0x%x)\\n"'),
    _r("amd_preempt_failed",
       r"ring \d+ failed to (?:preempt ib|be preempted)|Timeout waiting for (?:VM flush ACK|sem acquire in VM flush)",
       "ring_timeout", W, "amd", "the GPU did not preempt a ring or acknowledge a VM flush in time", "gpu_fault",
       "failed to preempt|failed to be preempted|Timeout waiting for",
       'amdgpu/gfx_v11_0.c: "ring %d failed to preempt ib\\n"',
       'amdgpu/sdma_v6_0.c: "ring %d failed to be preempted\\n"',
       'amdgpu/gmc_v9_0.c: "Timeout waiting for VM flush ACK!\\n"',
       'amdgpu/gmc_v9_0.c: "Timeout waiting for sem acquire in VM flush!\\n"'),
    _r("amd_illegal_command", r"Illegal (?:register access|opcode|instruction) in command stream",
       "ring_timeout", W, "amd", "a command stream did something illegal; its ring will be reset", "gpu_fault",
       "in command stream",
       'amdgpu/gfx_v11_0.c: "Illegal register access in command stream\\n"',
       'amdgpu/gfx_v11_0.c: "Illegal opcode in command stream \\n"',
       'amdgpu/gfx_v11_0.c: "Illegal instruction in command stream\\n"'),
    # --- AMD: resets --------------------------------------------------------------------------------
    _r("amd_reset_begin", r"GPU (?:reset|jobs stop) begin", "gpu_reset", W, "amd",
       "the driver started a full GPU reset; VRAM and contexts may be lost", "reset",
       "begin",
       'amdgpu/amdgpu_device.c: "GPU %s begin!\\n"'),
    _r("amd_reset_mode12", r"\b(?i:mode[12]) reset\s*$|GPU (?:psp )?mode1 reset\s*$", "gpu_reset", W, "amd",
       "a full GPU reset (MODE1/MODE2) is running", "reset",
       "MODE1|MODE2|mode1|mode2|Mode1|Mode2",
       'amdgpu/soc21.c: "MODE1 reset\\n"',
       'amdgpu/soc21.c: "MODE2 reset\\n"',
       'amdgpu/amdgpu_device.c: "GPU mode1 reset\\n"',
       'amdgpu/amdgpu_device.c: "GPU psp mode1 reset\\n"'),
    _r("amd_reset_method", r"\bBACO reset\s*$|GPU (?:pci config )?reset\s*$", "gpu_reset", W, "amd",
       "a full GPU reset is running", "reset",
       "BACO|GPU reset|GPU pci config reset",
       'amdgpu/soc21.c: "BACO reset\\n"',
       'amdgpu/cik.c: "GPU pci config reset\\n"'),
    _r("amd_ring_reset_failed", r"\b(?:Ring \S+|\w+ queue) reset failed", "gpu_reset", W, "amd",
       "a per-ring reset failed; the driver escalates to a full reset", "reset",
       "reset failed",
       'amdgpu/amdgpu_job.c (Linux 6.15+): "Ring %s reset failed\\n"'),
    _r("amd_reset_succeeded", r"GPU reset(?:\(\d+\))? succeeded|Ring \S+ reset succeeded", "gpu_reset", I, "amd",
       "the GPU reset succeeded", "reset",
       "reset succeeded|) succeeded",
       'amdgpu/amdgpu_device.c: "GPU reset(%d) succeeded!\\n"',
       'amdgpu/amdgpu_device.c: "GPU reset succeeded, trying to resume\\n"',
       'amdgpu/amdgpu_job.c (Linux 6.15+): "Ring %s reset succeeded\\n"'),
    _r("amd_ring_reset_start", r"Starting \S+ ring reset", "gpu_reset", I, "amd",
       "the driver is resetting one ring", "reset",
       "ring reset",
       'amdgpu/amdgpu_job.c (Linux 6.15+): "Starting %s ring reset\\n"'),
    _r("amd_vram_lost", r"VRAM is lost", "gpu_reset", W, "amd",
       "VRAM contents were lost in the reset: every GPU process must restart", "reset",
       "VRAM is lost",
       'amdgpu/amdgpu_device.c: "VRAM is lost due to GPU reset!\\n"'),
    _r("amd_suspend_failed", r"suspend of IP block <\w+> failed", "gpu_reset", W, "amd",
       "a GPU block failed to suspend before a reset or sleep", "reset",
       "suspend of IP block",
       'amdgpu/amdgpu_device.c: "suspend of IP block <%s> failed %d\\n"'),
    # --- AMD: memory, RAS, SMU ----------------------------------------------------------------------
    _r("amd_page_fault", r"\[(?:gfx|mm)hub\d*\] (?:no-retry |retry )?(?:VMC )?page fault|\bVM fault \(0x|"
       r"\w+_L2_PROTECTION_FAULT_STATUS:|GPU fault detected: \d+|Can't handle page fault",
       "page_fault", W, "amd", "GPU page fault: a process touched unmapped GPU memory", "gpu_fault",
       "page fault|VM fault|_L2_PROTECTION_FAULT_STATUS|GPU fault detected",
       'amdgpu/gmc_v9_0.c: "[%s] %s page fault (src_id:%u ring:%u vmid:%u pasid:%u)\\n"',
       'amdgpu/gmc_v9_0.c: "VM_L2_PROTECTION_FAULT_STATUS:0x%08X\\n"',
       'amdgpu/gfxhub_v2_0.c: "GCVM_L2_PROTECTION_FAULT_STATUS:0x%08X\\n"',
       'amdgpu/gmc_v8_0.c: "GPU fault detected: %d 0x%08x\\n"',
       'amdgpu/gmc_v8_0.c: "VM fault (0x%02x, vmid %d, pasid %d) at page %u, %s from \'%s\' (0x%08x) (%d)\\n"',
       'amdgpu/amdgpu_vm.c: "Can\'t handle page fault (%d)\\n"'),
    _r("amd_ras_uncorrectable",
       r"\b(?:uncorrectable|uncorrected) (?:hardware )?errors? ?(?:\(\w+\) )?(?:detected|occurred)|"
       r"\buncorrectable hardware error\(|RAS controller interrupt|ERREVENT_ATHUB_INTERRUPT|poison (?:is )?consumed|"
       r"RAS Intr triggered, device disabled|RAS records:\d+ exceed threshold",
       "ras_error", C, "amd", "uncorrectable hardware error (RAS)", "ras",
       "uncorrect|Uncorrect|RAS controller|ERREVENT_ATHUB|poison|RAS Intr|exceed threshold",
       'amdgpu/amdgpu_ras.c (RAS_EVENT_LOG): "uncorrectable hardware error(ERREVENT_ATHUB_INTERRUPT) detected!\\n"',
       'amdgpu/amdgpu_ras.c (RAS_EVENT_LOG): "%lld new uncorrectable hardware errors detected in %s block\\n"',
       'amdgpu/amdgpu_kms.c: "RAS Intr triggered, device disabled!!"',
       'amdgpu/amdgpu_ras_eeprom.c: "RAS records:%d exceed threshold:%d"',
       'amdgpu/amdgpu_ras_eeprom.c: "RAS records:%d exceed threshold:%d, GPU will not be initialized. Replace this'
       ' GPU or increase the threshold"'),
    _r("amd_cp_ecc", r"CP ECC ERROR IRQ", "ras_error", W, "amd", "the command processor reported an ECC error",
       "ras",
       "CP ECC ERROR",
       'amdgpu/amdgpu_gfx.c: "CP ECC ERROR IRQ\\n"'),
    _r("amd_sw_ctf", r"GPU over temperature range\(SW CTF\)|going to shutdown due to GPU SW CTF", "thermal", C,
       "amd", "the GPU passed its critical temperature; the system shuts down", "thermal",
       "SW CTF",
       'pm/swsmu/amdgpu_smu.c: "ERROR: GPU over temperature range(SW CTF) detected!\\n"',
       'pm/swsmu/amdgpu_smu.c: "ERROR: System is going to shutdown due to GPU SW CTF!\\n"'),
    _r("amd_ras_correctable", r"\bcorrectable (?:hardware )?errors? detected", "ras_error", I, "amd",
       "correctable hardware error (RAS)", "ras",
       "correctable",
       'amdgpu/amdgpu_ras.c (RAS_EVENT_LOG): "%lld new correctable hardware errors detected in %s block\\n"'),
    _r("amd_smu_failure", r"\bSMU\b.*(?:fail|timeout|[Tt]imed out|not done)|\bsmu_\w+.*(?:failed|timeout)|"
       r"SMC is not ready|\[powerplay\] .*[Ff]ailed|Failed to send message 0x|"
       r"SMU: (?:I'm very busy|response:|unknown command|valid command, bad prerequisites|I'm debugging)|"
       r"Fail(?:ed)? to disable (?:dpm|smu) features|"
       r"Failed to \w+ (?:BACO state|gfxoff)!|\[PrepareMp1\] Failed|SMC failed to set mp1 state",
       "smu_error", W, "amd", "the power-management firmware (SMU) failed a request", "gpu_fault",
       "SMU|smu_|SMC is not ready|powerplay|Failed to send message|dpm features|smu features|BACO state|gfxoff|"
       "PrepareMp1|mp1 state",
       'pm/swsmu/smu_cmn.c: "SMU: I\'m not done with your previous command: SMN_C2PMSG_66:0x%08X'
       ' SMN_C2PMSG_82:0x%08X"',
       'pm/swsmu/amdgpu_smu.c: "SMC is not ready\\n"',
       'pm/swsmu/smu13/smu_v13_0_6_ppt.c: "Failed to export SMU metrics table!\\n"',
       'pm/powerplay/smumgr/smu9_smumgr.c: "Failed to send message 0x%x, response 0x%x\\n"',
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
       'amdgpu/amdgpu_device.c: "SMC failed to set mp1 state %d, %d\\n"'),
    # --- PCIe AER (drivers/pci/pcie) and APEI/GHES -------------------------------------------------
    _r("aer_no_callback", r"AER: can't recover \(no error_detected callback\)|device has no AER-aware driver",
       "pcie_aer", W, "pcie", "a device on a failing PCIe link has no error recovery", "aer",
       "can't recover|no AER-aware driver",
       'pci/pcie/err.c: "can\'t recover (no error_detected callback)\\n"',
       'pci/pcie/err.c (before 5.x): "device has no AER-aware driver\\n"', quiet=True),
    _r("aer_recovery_failed", r"AER: [Dd]evice recovery failed", "pcie_aer", W, "pcie",
       "PCIe error recovery failed: the devices behind this port may be lost", "aer",
       "recovery failed",
       'pci/pcie/err.c: "device recovery failed\\n"'),
    _r("aer_fatal", r"Uncorrect(?:ed|able) \(Fatal\)|DPC: containment event", "pcie_aer", C, "pcie",
       "fatal uncorrected PCIe error", "aer",
       "(Fatal)|DPC: containment",
       'pci/pcie/aer.c: "PCIe Bus Error: severity=%s, type=%s, (%s)\\n" with "Uncorrectable (Fatal)"',
       'pci/pcie/dpc.c: "containment event, status:%#06x source:%#06x\\n"'),
    _r("aer_nonfatal", r"Uncorrect(?:ed|able) \(Non-Fatal\)", "pcie_aer", W, "pcie",
       "uncorrected, non-fatal PCIe error", "aer",
       "(Non-Fatal)",
       'pci/pcie/aer.c: "%s%s error message received from %04x:%02x:%02x.%d\\n" with "Uncorrectable (Non-Fatal)"'),
    _r("aer_corrected", r"AER: (?:Multiple )?Correct(?:ed|able) error|severity=Correct(?:ed|able)", "pcie_aer", I,
       "pcie", "corrected PCIe error (the link retried)", "aer",
       "Correct",
       'pci/pcie/aer.c: "%s%s error message received from %04x:%02x:%02x.%d\\n" with "Correctable"',
       'pci/pcie/aer.c: "PCIe Bus Error: severity=%s, type=%s, (%s)\\n" with "Correctable"'),
)

# APEI/GHES records (drivers/firmware/efi/cper.c: "%sevent severity: %s\n", "%s section_type: %s\n"): the
# record's `{N}` id ties its severity line to its section line; a PCIe section is a pcie_aer event of that
# severity. Rule name and provenance for the evidence:
GHES_RECORD = r"^\{(?P<id>\d+)\}\[Hardware Error\]:"
GHES_SEVERITY = r"event severity: (?P<severity>corrected|recoverable|fatal|info)"
GHES_PCIE = r"section_type: PCIe error"
GHES_SEVERITIES = {"corrected": I, "info": I, "recoverable": W, "fatal": C}
GHES_RULE = Rule("ghes_pcie", GHES_PCIE, "pcie_aer", I, "pcie", "PCIe error reported by firmware (APEI/GHES)", "aer",
                 ("Hardware Error",), ('firmware/efi/cper.c: "%sevent severity: %s\\n"',
                                       'firmware/efi/cper.c: "%ssection_type: %s\\n"'))

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
              "end trace", "end Kernel panic", "invalid op", "blocked for more than")
# A stack frame: `func+0x12/0x60 [module]` (`[module buildid]` since 5.x), in `RIP:`, `IP:` and trace lines.
FRAME = r"[\w.]+\+0x[0-9a-f]+/0x[0-9a-f]+(?: \[(?P<module>\w+)(?: [0-9a-f]+)?\])?"
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


@dataclass(frozen=True, slots=True)
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
    Correlation("gpu_without_aer_recovery", ("aer_no_callback",), ("aer_recovery_failed",), 10.0, C,
                "PCIe error recovery failed and the GPU's driver cannot recover: the GPU is lost",
                emit="device_lost", either_order=True, runbook="device_lost", needs_gpu=True),
)
