"""Every error-level message template of the pinned amdgpu files is classified by a rule or ignored with a reason.

tests/data/amdgpu-templates.json holds only the format strings (with file, line and level) extracted from the
amdgpu driver at a pinned commit (its `provenance` says which). A template counts as classified when a built-in
rule cites it in its sources, or when the line it prints (the format with plain values) matches a rule. Each
ignore entry below is a pattern over templates with the reason gpuwarden does not need to see that line.
`python tests/unit/test_templates.py` prints the coverage shown in the README.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from gpuwarden.alert.runbooks import RUNBOOKS
from gpuwarden.kernel.rules import CORRELATIONS, GHES_RULE, RULES

DATA = json.loads((Path(__file__).resolve().parents[1] / "data" / "amdgpu-templates.json").read_text())

_INIT = ("driver load or IP bring-up: when it fails the GPU does not come up, and that outcome is classified "
         "('hw_init/sw_init/late_init of IP block <%s> failed', 'amdgpu_device_ip_init failed', 'Fatal error "
         "during GPU init')")
_FIRMWARE = ("firmware load or cache set-up at init or resume: a failure surfaces as 'hw_init/resume of IP block "
             "<gfx|mes|smu> failed', which is classified")
_SMU_SETUP = ("SMU set-up at load, suspend or resume: a failure surfaces as 'hw_init/resume/suspend of IP block "
              "<smu> failed', which is classified")
_TUNING = ("a power or clock tuning request (sysfs, display, workload profile, fan) was refused; running jobs "
           "are unaffected")

IGNORED: tuple[tuple[str, str], ...] = (
    # (pattern over "file: format", reason)
    (r"Invalid (?:block )?callback to (?:read|write)", "a driver programming error about register callbacks; "
     "no hardware state"),
    (r"Invalid value for amdgpu\.|invalid lockup_timeout|could not parse disable_cu|disable_cu .* out of range|"
     r"Invalid KCQ enabled", "a bad module parameter, reported at load"),
    (r"set_(?:clock|power)gating_state", "clock/power gating set-up; the GPU keeps running ungated"),
    (r"gpu_info firmware|Unsupported gpu_info table|no vBIOS found|amdgpu_atom\w+ failed|atombios|"
     r"amdgpu_fence_driver_sw_init|amdgpu_mem_scratch_init|amdgpu_device_wb_init|allocate (?:CSA|seq64) failed|"
     r"IB initialization failed|hw_init %d failed|Failed to create (?:\w+ )?(?:scheduler|scheduling entity)|"
     r"Failed to allocate (?:wq for )?amdgpu_reset_domain|ring (?:\w+ )?wb alloc failed|\(%d\) ring create failed|"
     r"failed initializing fences|Failed to (?:init|initialize) (?:rlc|MEC|KIQ|gfx ras|sdma ras|imu)|"
     r"Failed to register gfx ras block|Failed to allocate (?:memory for|GART)|Failed to allocated memory|"
     r"No VRAM object for PCIE GART|ring_mux|Failed setting up GFX kernel entity|Failed to find a queue for KIQ|"
     r"KIQ failed to set resources|Cannot register more gpu instance|ras_late_init|Failed to create RAS sysfs|"
     r"query_status_fence_offs|read_val_offs|Failed to allocate MES doorbell|\(%l?d\) failed to create|"
     r"\(%l?d\) failed to allocate wb slot|PIPE%d ucode data fw size", _INIT),
    (r"failed to (?:invalidate|prime) (?:instruction|RS64 data) cache|rlc autoload|failed to wait rlc autoload|"
     r"failed to load (?:pfp|me) fw|failed to (?:load )?MES (?:kiq )?fw|failed mes_v11_0_set_hw_resources_1|"
     r"Load microcode failed", _FIRMWARE),
    (r"Problem resizing BAR0", "a BAR resize at load; the driver continues with the BAR it has"),
    (r"Failed to store PCI saved state", "caching PCI config space for a later reset; the reset itself is "
     "classified"),
    (r"VF exclusive mode timeout|release exclusive mode on fini", "SR-IOV virtual functions only"),
    (r"registering (?:atombios|pm) sysfs|Creating firmware sysfs|Could not create amdgpu (?:device|board) attr|"
     r"amdgpu_pmu_init failed", "sysfs or perf registration at load; the GPU works without it"),
    (r"enable mgpu fan boost failed|pstate setting failed|Attempt to override pcie params|"
     r"min deepsleep dcefclk|Failed to (?:set|switch|upload|change|notify|apply|populate) |\[SetDfCstate\]|"
     r"New power limit|Invalid clock type|Unsupported block type|Failed to power %s", _TUNING),
    (r"pm/swsmu/.*(?:Failed to (?:init|setup|sw init|sw fini|smu_fini|get|post|enable|retrieve|register|"
     r"transfer|SetDramLogDramAddr|SetDriverDramAddr|SetToolsDramAddr)|VRAM allocation for|Fail to notify rlc|"
     r"Fail to disable thermal alert|enable gfx features failed|pp table size not matched|Failed system features|"
     r"wbrf|UclkShadow|Failed to retrieve enabled ppfeatures)", _SMU_SETUP),
    (r"Process information: process", "names the process of a ring timeout: part of that report, whose "
     "'ring %s timeout' line is classified"),
    (r"Error (?:getting VM ID|scheduling IBs)|couldn't schedule ib|scheduling IB failed|failed to get a new IB|"
     r"failed to emit fence|VM IB without ID|secure submissions not supported",
     "a submission error returned to the process (often -ECANCELED after a reset); hangs surface as ring "
     "timeouts, which are classified"),
    (r"cp failed to lock ring|dma failed to lock ring|failed to get ib|fence wait failed|ib submit failed|"
     r"GDS workarounds failed to lock ring", "a step of a ring or IB self-test whose failure line "
     "('ring %s test failed', 'IB test failed on %s') is classified"),
    (r"amdgpu/gmc_v9_0\.c: .*(?:in page starting at address|for process %s pid|cookie node_id|\\t "
     r"(?:Faulty UTCL2|MORE_FAULTS|WALKER_ERROR|PERMISSION_FAULTS|MAPPING_ERROR|RW))",
     "a detail line of a VM-fault report whose header and VM_L2_PROTECTION_FAULT_STATUS line are classified"),
    (r"gfx mutex during soft reset|fail to (?:un)?resv mqd_obj|reset queue_type\(%d\) not supported",
     "a step inside a queue or soft reset; the reset's outcome is classified"),
    (r"critical bug! too many kiq readers|Attempted to enable KFD scheduler|RAS ERROR: Unbalance obj|"
     r"still active bo inside vm|VMPT only supports|Invalid ucode id|Invalid crtc|unsupported misc op",
     "a driver bookkeeping or programming error with no hardware state behind it"),
    (r"bo %p va .* conflict with", "a process asked for an overlapping GPU mapping; it gets -EINVAL"),
    (r"mes (?:\w+ )+is not supported|gang id %d doesn't exist|pasid %d doesn't exist|queue id %d doesn't exist|"
     r"queue list is not empty|no more memory to create mes process|failed to (?:add|allocate idr for) gang|"
     r"failed to add ring|failed to (?:alloc|map) ctx meta data|failed to allocate process context bo|"
     r"failed to clear page tables|failed to create (?:MES process|bo_va)|failed to do (?:bo_map|vm_bo_update)|"
     r"failed to initialize vm|failed to lock pasid|failed to update pdes|failed to set_shader_debugger|"
     r"failed to reg_write_reg_wait|Failed to allocate memory for queue",
     "MES queue bookkeeping for one process; the process gets an error, MES hangs show as 'MES failed to "
     "respond', which is classified"),
    (r"amdgpu_ras\.c: (?:Failed to (?:load|save) EEPROM table|Poison message fifo is full|ras %s %s failed poison|"
     r"ras inject %s failed)", "RAS bookkeeping and error injection (a test tool); the hardware errors "
     "themselves are classified"),
    (r"amdgpu_ras_eeprom\.c: ", "the RAS bad-page table on the board's EEPROM (I2C): table I/O, not the GPU; "
     "boards without SMBus print these harmlessly (corpus 093). 'RAS records exceed threshold' is classified"),
    (r"GFX Subblock %s, (?:driver|hardware) do not support type", "RAS error injection into an unsupported "
     "block (a test tool)"),
    (r"failed to read gpu clock", "a clock-counter read for a profiling query"),
    (r"IH: wrong ring_ID detected", "an interrupt routed to the wrong SDMA instance; the interrupt is dropped"),
)

_SPEC = re.compile(r"%(?:%|[-+ #0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|z|j|t)?([diouxXcsp])[A-Za-z]*)")
_VALUES = {"d": "1", "i": "1", "u": "1", "o": "1", "x": "1f", "X": "1F", "c": "c", "s": "sdma0",
           "p": "00000000deadbeef"}


def render(fmt: str) -> str:
    """The line a format prints, with plain values (`%s` -> sdma0, `%d` -> 1)."""
    text = fmt.replace("\\n", "").replace('\\"', '"').replace("\\t", "\t").replace("\\\\", "\\")
    return _SPEC.sub(lambda m: "%" if m.group(0) == "%%" else _VALUES[m.group(1)], text)


def _cited() -> set[tuple[str, str]]:
    cited = set()
    for rule in RULES:
        for source in rule.sources:
            path, _, fmt = source.partition(": ")
            cited.add((path, fmt[1:-1] if fmt.startswith('"') and fmt.endswith('"') else fmt))
    return cited


def coverage() -> tuple[Counter, list[dict]]:
    """(count per outcome, templates neither classified nor ignored) over the error-level templates."""
    cited, rules = _cited(), [re.compile(r.pattern) for r in RULES]
    ignored = [(re.compile(p), reason) for p, reason in IGNORED]
    counts: Counter = Counter()
    unaccounted = []
    for t in DATA["templates"]:
        if t["level"] != "error":
            continue
        if (t["file"], t["format"]) in cited:
            counts["cited by a rule"] += 1
        elif any(r.search(render(t["format"])) for r in rules):
            counts["matched by a rule"] += 1
        elif any(p.search(f"{t['file']}: {t['format']}") for p, _ in ignored):
            counts["ignored with a reason"] += 1
        else:
            unaccounted.append(t)
    return counts, unaccounted


def test_every_error_template_is_classified_or_ignored_with_a_reason():
    counts, unaccounted = coverage()
    assert not unaccounted, "\n".join(f"{t['file']}:{t['line']}: {t['format']}" for t in unaccounted)
    assert sum(counts.values()) >= 400 and counts["cited by a rule"] + counts["matched by a rule"] >= 40


def test_every_ignore_entry_is_used_and_has_a_reason():
    texts = [f"{t['file']}: {t['format']}" for t in DATA["templates"] if t["level"] == "error"]
    for pattern, reason in IGNORED:
        assert len(reason) > 20 and any(re.search(pattern, text) for text in texts), pattern


def test_rules_cite_only_templates_that_exist_in_the_pinned_files():
    pinned = {(t["file"], t["format"]) for t in DATA["templates"]}
    files = set(DATA["provenance"]["files"])
    stale = [(path, fmt) for path, fmt in _cited() if path in files and (path, fmt) not in pinned]
    assert not stale, stale


def test_every_builtin_rule_carries_its_provenance_and_a_known_runbook():
    for rule in (*RULES, GHES_RULE):
        assert rule.sources and all(": " in source for source in rule.sources), rule.name
        assert rule.runbook in RUNBOOKS, rule.name
    for corr in CORRELATIONS:
        assert corr.emit is None or corr.runbook in RUNBOOKS, corr.name


def test_the_pinned_data_has_its_provenance():
    provenance = DATA["provenance"]
    assert re.fullmatch(r"[0-9a-f]{40}", provenance["commit"]) and provenance["repository"]
    assert {t["file"] for t in DATA["templates"]} == set(provenance["files"])


if __name__ == "__main__":
    counts, unaccounted = coverage()
    total = sum(counts.values()) + len(unaccounted)
    print(f"{total} error-level templates in {len(DATA['provenance']['files'])} amdgpu files "
          f"({DATA['provenance']['repository']} @ {DATA['provenance']['commit'][:12]}):")
    for outcome, n in counts.most_common():
        print(f"  {n:4} {outcome}")
    print(f"  {len(unaccounted):4} unaccounted")
