"""`gpuwarden doctor`: a preflight of a multi-GPU box. `collect` reads the machine; `diagnose` is pure and
turns those facts into findings, each with what it means and what to do."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from gpuwarden.act import guard
from gpuwarden.act.quarantine import Poisoned, cache_dirs, scan
from gpuwarden.alert.runbooks import runbook_for
from gpuwarden.config.settings import Config, GpuConfig
from gpuwarden.core.counts import plural
from gpuwarden.core.model import GpuSample, Severity
from gpuwarden.gpu import pci, vendors
from gpuwarden.gpu.discovery import Gpu, discover
from gpuwarden.gpu.pci import PciNode
from gpuwarden.gpu.rules import TelemetryRules

I, W = Severity.INFO, Severity.WARNING
# Switches made by chipset vendors: a GPU behind one hangs off the chipset (AMD's Promontory chipsets are
# AMD- or ASMedia-made; a Radeon's own on-card switch is ATI's 0x1002, a riser's is PLX/Broadcom's).
CHIPSET_SWITCH_VENDORS = {0x1022: "AMD chipset", 0x1b21: "ASMedia chipset"}
INTEL, INTEL_PCH_SLOTS = 0x8086, {0x1B, 0x1C, 0x1D}  # Intel's PCH root ports sit at these bus-0 device numbers
SWITCH_PORTS = {"upstream_port", "downstream_port"}
GiB = 1 << 30


@dataclass(frozen=True)
class Finding:
    severity: Severity
    check: str  # bar, link, atomics, chipset, numa, root_complex, iommu, asymmetry, guard, cache, gpu
    subject: str  # a GPU's PCI address, a cache directory, or "host"
    what: str
    advice: str = ""


@dataclass(frozen=True)
class GpuFacts:
    gpu: Gpu
    chain: list[PciNode]  # the GPU, then each bridge above it; the last is the root port
    bars: list[tuple[int, int, bool]]
    numa_node: int | None
    root_complex: str
    iommu: str | None
    sample: GpuSample | None


@dataclass(frozen=True)
class Facts:
    gpus: list[GpuFacts]
    guard: list[tuple[Path, bool]] = field(default_factory=list)
    poisoned: list[Poisoned] = field(default_factory=list)
    now: float = 0.0


# --- reading the machine ------------------------------------------------------------------------------

def collect(config: Config, samples: dict[str, GpuSample]) -> Facts:
    root = config.gpu.sysfs_root
    gpus = []
    for gpu in discover(root):
        gpus.append(GpuFacts(gpu, pci.upstream(root, gpu.pci), pci.bars(root, gpu.pci), pci.numa_node(root, gpu.pci),
                             pci.root_complex(root, gpu.pci), pci.iommu_type(root, gpu.pci), samples.get(gpu.pci)))
    paths = guard.paths_for(config.guard.devices or [g.gpu.pci for g in gpus], root)
    return Facts(gpus, guard.status(paths, root) if paths else [], scan(cache_dirs(config.cache)), time.time())


# --- judging --------------------------------------------------------------------------------------------

def diagnose(facts: Facts, config: GpuConfig) -> list[Finding]:
    findings = []
    for g in facts.gpus:
        findings += [_summary(g), *_bar(g), *_links(g, config), *_root_port(g, len(facts.gpus))]
    findings += [*_placement(facts.gpus), *_iommu(facts.gpus), *_telemetry(facts, config), *_guard(facts.guard),
                 *_caches(facts.poisoned)]
    return findings


def worst(findings: list[Finding]) -> Severity:
    return max((f.severity for f in findings), default=I)


def _summary(g: GpuFacts) -> Finding:
    s, top = g.sample, g.chain[0]
    parts = [f"{g.gpu.vendor} {s.model if s and s.model else _ids(top)}", f"driver {g.gpu.driver or 'none'}",
             f"NUMA node {g.numa_node if g.numa_node is not None else 'unknown'}", g.root_complex]
    if len(g.chain) > 1:
        parts.append(f"root port {g.chain[-1].bdf} ({'chipset' if _chipset(g.chain[-1], g.chain[1:-1]) else 'CPU'})")
    if g.bars:
        parts.append(f"largest BAR {_size(max(size for _, size, _ in g.bars))}")
    if top.max_speed_gts:
        parts.append(f"link {top.speed_gts or '?'} GT/s x{top.width or '?'} of {top.max_speed_gts} GT/s "
                     f"x{top.max_width or '?'}")
    return Finding(I, "gpu", g.gpu.pci, ", ".join(parts))


def _bar(g: GpuFacts) -> list[Finding]:
    if not g.bars:
        return []
    largest = max(size for _, size, _ in g.bars)
    s = g.sample
    if not (s and s.vram_total_bytes and s.vram_visible_total_bytes):
        return []
    vram, visible = s.vram_total_bytes, s.vram_visible_total_bytes
    if visible >= vram:
        return [Finding(I, "bar", g.gpu.pci, f"large BAR active: the CPU sees all {_size(vram)} of VRAM "
                        f"(BAR {_size(largest)})")]
    return [Finding(W, "bar", g.gpu.pci,
                    f"BAR is {_size(largest)}: the CPU sees {_size(visible)} of {_size(vram)} VRAM",
                    "The card's VBIOS or the board firmware gives it a small BAR, so peer-to-peer and large-BAR "
                    "paths are unavailable and host copies go through a small window. Enable 'Above 4G decoding' "
                    "and 'Re-Size BAR support' in the firmware setup; if the BAR stays small, the VBIOS asks for a "
                    "small BAR on this board. Never write resource*_resize on a running system.")]


def _links(g: GpuFacts, config: GpuConfig) -> list[Finding]:
    """Each link from the GPU up to the root port (at what both ends can do): one that cannot reach the GPU's
    speed or width, or one trained below that (a warning under load; at idle amdgpu lowers it on purpose)."""
    chain, findings = g.chain, []
    want_speed, want_width = chain[0].max_speed_gts, chain[0].max_width
    busy = bool(g.sample and g.sample.busy_ratio is not None and g.sample.busy_ratio >= config.busy_ratio)
    for index, (below, above) in enumerate(pairwise(chain)):
        if not _is_link(below, index):
            continue
        cap_speed = _least(below.max_speed_gts, above.max_speed_gts)
        cap_width = _least(below.max_width, above.max_width)
        speed, width = below.speed_gts or above.speed_gts, below.width or above.width
        where = f"the link {below.bdf} ({_role(below)}) <-> {above.bdf} ({_role(above)})"
        slow = []
        if cap_speed and want_speed and cap_speed < want_speed:
            slow.append(f"{cap_speed} GT/s")
        if cap_width and want_width and cap_width < want_width:
            slow.append(f"x{cap_width}")
        if slow:
            limiter = min((below, above), key=lambda n: (n.max_speed_gts or 1e9, n.max_width or 1e9))
            findings.append(Finding(
                W, "link", g.gpu.pci, f"{where} can do at most {' '.join(slow)}; the GPU can do {want_speed} GT/s "
                f"x{want_width}", f"{limiter.bdf} ({_role(limiter)}, {_ids(limiter)}) limits it: move the GPU to a "
                "slot whose path runs at the GPU's speed, or replace the riser or switch."))
        elif (speed and cap_speed and speed < cap_speed) or (width and cap_width and width < cap_width):
            findings.append(Finding(
                W if busy else I, "link", g.gpu.pci, f"{where} runs at {speed} GT/s x{width} of {cap_speed} GT/s "
                f"x{cap_width}" + ("" if busy else " (the GPU is idle)"),
                "Under load this is a bad contact or a BIOS slot setting: reseat the card and riser, set the slot's "
                "speed to Auto/Gen4+. At idle the driver may lower the link on purpose: check again under load."))
    return findings


def _is_link(node: PciNode, index: int) -> bool:
    """Whether a cable-or-slot link runs from `node` up to its parent: not from a switch's downstream port,
    which sits on the switch's internal bus. Without config space, by position: GPU, link, switch, link..."""
    return node.pcie.port_type != "downstream_port" if node.pcie else index % 2 == 0


def _root_port(g: GpuFacts, gpu_count: int) -> list[Finding]:
    if len(g.chain) < 2:
        return [Finding(I, "atomics", g.gpu.pci, "no root port above it (an integrated GPU, or a virtual machine's "
                        "flat PCI bus): its path and AtomicOps are not judged")]
    root, switches, findings = g.chain[-1], g.chain[1:-1], []
    chipset = _chipset(root, switches)
    if chipset:
        findings.append(Finding(
            W if gpu_count > 1 else I, "chipset", g.gpu.pci, f"attached to a chipset port ({chipset}), not to the "
            f"CPU; root port {root.bdf}",
            "It shares the chipset's uplink (often PCIe x4) with USB, SATA and NVMe, and chipset ports often "
            "complete no AtomicOps. Put the GPUs that talk to each other in CPU-attached slots."))
    needs_atomics = (vendor := vendors.named(g.gpu.vendor)) is not None and vendor.needs_atomics
    if root.pcie is None:
        findings.append(Finding(I, "atomics", g.gpu.pci, f"AtomicOp support of root port {root.bdf} unknown: its "
                                "config space is readable by root only", "Run `gpuwarden doctor` as root."))
    elif not root.pcie.atomic_completer:
        findings.append(Finding(
            W if needs_atomics else I, "atomics", g.gpu.pci,
            f"root port {root.bdf} ({'chipset' if chipset else 'CPU'}) does not complete 32/64-bit PCIe AtomicOps",
            "ROCm needs AtomicOp completion at the root port for multi-GPU work and host-memory atomics; without it "
            "ROCm runs degraded or refuses the GPU. Use a CPU-attached slot (CUDA does not need it)."))
    for switch in switches:
        if switch.pcie and switch.pcie.port_type in SWITCH_PORTS and not switch.pcie.atomic_routing:
            findings.append(Finding(W if needs_atomics else I, "atomics", g.gpu.pci,
                                    f"switch port {switch.bdf} ({_ids(switch)}) does not route AtomicOps",
                                    "ROCm's AtomicOps cannot reach the root port through this switch."))
    return findings


def _chipset(root: PciNode, switches: list[PciNode]) -> str | None:
    if root.vendor == INTEL and int(root.bdf.split(":")[-1].split(".")[0], 16) in INTEL_PCH_SLOTS:
        return f"Intel PCH root port {root.bdf}"
    return next((f"{CHIPSET_SWITCH_VENDORS[s.vendor]} switch {s.bdf}" for s in switches
                 if s.vendor in CHIPSET_SWITCH_VENDORS), None)


def _placement(gpus: list[GpuFacts]) -> list[Finding]:
    findings = []
    for check, key, what, advice in (
        ("numa", lambda g: g.numa_node, "NUMA node",
         "Traffic between GPUs on different nodes crosses the CPU interconnect: keep a tensor-parallel group on "
         "one node and pin each engine (numactl) to its GPUs' node."),
        ("root_complex", lambda g: g.root_complex, "root complex",
         "Peer-to-peer between GPUs under different root complexes goes through the CPU fabric: slower, and some "
         "platforms do not route it at all. Keep GPUs that talk to each other under one root complex."),
    ):
        groups = defaultdict(list)
        for g in gpus:
            if key(g) is not None:
                groups[key(g)].append(g.gpu.pci)
        if len(groups) > 1:
            split = "; ".join(f"{what} {k}: {', '.join(v)}" for k, v in sorted(groups.items()))
            findings.append(Finding(I, check, "host", f"the GPUs are split across {len(groups)} {what}s ({split})",
                                    advice))
    return findings


def _iommu(gpus: list[GpuFacts]) -> list[Finding]:
    """The IOMMU mode the GPUs' groups run in: none, passthrough (identity) or translated (DMA, DMA-FQ)."""
    if not gpus:
        return []
    modes = defaultdict(list)
    for g in gpus:
        modes[g.iommu or "no IOMMU group"].append(g.gpu.pci)
    what = "IOMMU mode: " + "; ".join(f"{mode} ({', '.join(pcis)})" for mode, pcis in sorted(modes.items()))
    translated = any(mode in ("DMA", "DMA-FQ") for mode in modes)
    return [Finding(I, "iommu", "host", what,
                    "ROCm recommends iommu=pt (passthrough) on the kernel command line for multi-GPU peer-to-peer; "
                    "if P2P transfers hang or crawl, try it." if translated and len(gpus) > 1 else "")]


def _telemetry(facts: Facts, config: GpuConfig) -> list[Finding]:
    """The telemetry rules on one reading: power caps and overdrive of same-model GPUs, heat, fans, clocks.
    PCIe links are judged above, hop by hop."""
    samples = {g.gpu.pci: g.sample for g in facts.gpus if g.sample}
    changes = TelemetryRules(config).evaluate(samples, facts.now)
    events = [c.event for c in changes if c.event and c.event.kind != "pcie_link"]
    return [Finding(e.severity, "asymmetry" if e.kind == "config_asymmetry" else e.kind, e.gpu or "host",
                    e.message, runbook_for(e.kind, e.evidence.get("runbook")) or "") for e in events]


def _guard(status: list[tuple[Path, bool]]) -> list[Finding]:
    if not status:
        return []
    intact = sum(ok for _, ok in status)
    if intact == len(status):
        return [Finding(I, "guard", "host", f"recovery guard intact on all {intact} files")]
    if intact == 0:
        return [Finding(I, "guard", "host", "recovery guard not applied: nothing stops an unbind/bind 'recovery'",
                        "Run the gpuwarden service (it applies the guard), or `gpuwarden guard apply`.")]
    missing = ", ".join(str(p) for p, ok in status if not ok)
    return [Finding(W, "guard", "host", f"recovery guard lost on {len(status) - intact} of {len(status)} files: "
                    f"{missing}", "A driver reload or PCI rescan drops it: the daemon re-applies it; outside the "
                    "daemon run `gpuwarden guard apply`.")]


def _caches(poisoned: list[Poisoned]) -> list[Finding]:
    return [Finding(W, "cache", str(p.dir), f"{plural(p.count, 'zero-byte file')}, e.g. {', '.join(p.examples)}",
                    f"A write cut by a power loss: move the cache aside with `gpuwarden quarantine {p.dir}` and let "
                    "the engine recompile.") for p in poisoned]


def _least(a, b):
    return min(v for v in (a, b) if v) if a or b else None


def _role(node: PciNode) -> str:
    if node.pcie:
        return node.pcie.port_type.replace("_", " ")
    return "bridge" if node.is_bridge else "device"


def _ids(node: PciNode) -> str:
    return f"{node.vendor or 0:04x}:{node.device or 0:04x}"


def _size(n: float) -> str:
    return f"{n / GiB:g} GiB" if n >= GiB else f"{n / (1 << 20):g} MiB"
