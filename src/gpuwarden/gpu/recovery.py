"""The confirmation after a reboot: are all the GPUs back, as they were before the fault?

On the first start of each boot gpuwarden records a baseline of its GPUs (PCI address, model, driver, BAR sizes,
each link's speed and width up to the root port, AtomicOps at the root port) in the state dir. When it starts on
a new boot and a GPU lost before it is still lost (an open gpu_lost condition: a loss that ended before the
reboot asks for no confirmation), it compares the GPUs with that baseline by itself, waiting as long as a person
is told to wait for a card to come back, and emits `gpus_back` ("GPUs back 2/2, as before") or
`gpus_changed` (what differs: "ffff:03:00.0 link x16 → x4", "ffff:04:00.0 missing"). The baseline stays the one
from before the fault until the GPUs are back as before: a card that came back degraded is not the new normal.

`compare` and `verdict` are pure; `read` and `Recovery` are the thin I/O around them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuwarden.core import conditions
from gpuwarden.core.incidents import Incident
from gpuwarden.core.model import Event, Severity
from gpuwarden.core.plain import plain
from gpuwarden.gpu import pci
from gpuwarden.gpu.discovery import discover
from gpuwarden.runtime.offloop import OffLoop

log = logging.getLogger(__name__)

BASELINE = "gpu-baseline.json"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
WAIT = 600.0  # a card can take 7 minutes to come back: the runbook says wait 10, and so does gpuwarden
EVERY = 15.0  # seconds between looks while waiting
_READS = OffLoop("recovery", limit=1)  # sysfs, the baseline file: a hung read holds one thread
_READ_DEADLINE = 60.0


@plain
class GpuState:
    """A GPU as saved before a reboot, compared after it."""

    pci: str
    vendor: str
    model: str  # the product name where the driver gives one, else vendor:device
    driver: str | None
    bars: tuple[tuple[int, int], ...]  # (index, size in bytes) of each memory BAR
    links: tuple[tuple[str, float | None, int | None], ...]  # (device, GT/s, lanes) from the GPU up to the root
    atomics: bool | None  # the root port completes AtomicOps; None: unknown (config space needs root)


@plain
class Verdict:
    """How the GPUs came back after a reboot."""

    back: list[str]  # as before
    missing: list[str]
    changed: list[str]  # one line per difference, "ffff:03:00.0 link x16 → x4"
    new: list[str]  # GPUs that were not there before
    total: int  # GPUs before

    @property
    def as_before(self) -> bool:
        return not (self.missing or self.changed or self.new)


# --- pure ---------------------------------------------------------------------------------------------------

def compare(before: dict[str, GpuState], now: dict[str, GpuState]) -> Verdict:
    changed: list[str] = []
    back = []
    for address in sorted(set(before) & set(now)):
        differences = _differences(before[address], now[address])
        changed += differences
        if not differences:
            back.append(address)
    return Verdict(back, sorted(set(before) - set(now)), changed, sorted(set(now) - set(before)), len(before))


def verdict_event(v: Verdict, incident: str | None, lost: list[str], now: float,
                  gpus: dict[str, GpuState] | None = None) -> Event:
    """`gpus_back` or `gpus_changed`, for the incident that lost the GPUs (`lost`) in the last boot; `gpus`, as
    they are now, describe those back as before."""
    # the GPUs present now (their gpu_lost conditions end), and those the last boot lost
    evidence: dict[str, Any] = {"gpus_present": sorted({*v.back, *_subjects(v.changed)}), "lost": lost}
    if incident:
        evidence["incident"] = incident
    if v.as_before:
        evidence["changes"] = [f"{g} as before: {describe(gpus[g])}" for g in v.back if gpus and g in gpus]
        return Event("gpus_back", Severity.INFO, f"GPUs back {len(v.back)}/{v.total}, as before", now,
                     evidence=evidence)
    changes = [f"{m} missing" for m in v.missing] + v.changed + [f"{n} new (it was not there before)" for n in v.new]
    evidence.update(missing=v.missing, changed=v.changed, new=v.new, changes=changes)
    return Event("gpus_changed", Severity.CRITICAL if v.missing else Severity.WARNING,
                 f"GPUs after the reboot: {len(v.back)}/{v.total} back as before; {'; '.join(changes)}", now,
                 evidence=evidence)


def describe(g: GpuState) -> str:
    """`Radeon AI PRO R9700, driver amdgpu, link 16.0 GT/s x16, BAR 0 32 GiB, AtomicOps yes`."""
    speed, width = (g.links[0][1], g.links[0][2]) if g.links else (None, None)
    parts = [g.model, f"driver {g.driver or 'none'}", f"link {speed or '?'} GT/s x{width or '?'}"]
    if g.bars:
        index, size = max(g.bars, key=lambda bar: bar[1])
        parts.append(f"BAR {index} {_size(size)}")
    if g.atomics is not None:
        parts.append(f"AtomicOps {'yes' if g.atomics else 'no'}")
    return ", ".join(parts)


def _differences(a: GpuState, b: GpuState) -> list[str]:
    out = []
    if a.model != b.model:
        out.append(f"{a.pci} model {a.model} → {b.model}")
    if a.driver != b.driver:
        out.append(f"{a.pci} driver {a.driver or 'none'} → {b.driver or 'none'}")
    bars_a, bars_b = dict(a.bars), dict(b.bars)
    for index in sorted(set(bars_a) | set(bars_b)):
        if bars_a.get(index) != bars_b.get(index):
            out.append(f"{a.pci} BAR {index} {_size(bars_a.get(index))} → {_size(bars_b.get(index))}")
    links_b = {device: (speed, width) for device, speed, width in b.links}
    for device, speed, width in a.links:
        if device not in links_b:
            out.append(f"{a.pci} no longer behind {device}")
            continue
        at = "" if device == a.pci else f" (at {device})"
        new_speed, new_width = links_b[device]
        if width != new_width:
            out.append(f"{a.pci} link x{width or '?'} → x{new_width or '?'}{at}")
        if speed != new_speed:
            out.append(f"{a.pci} link {speed or '?'} GT/s → {new_speed or '?'} GT/s{at}")
    if a.atomics is not None and b.atomics is not None and a.atomics != b.atomics:
        out.append(f"{a.pci} AtomicOps at the root port {'yes → no' if a.atomics else 'no → yes'}")
    return out


def _subjects(lines: list[str]) -> set[str]:
    return {line.split(" ", 1)[0] for line in lines}


def _size(n: int | None) -> str:
    if n is None:
        return "none"
    return f"{n / (1 << 30):g} GiB" if n >= 1 << 30 else f"{n / (1 << 20):g} MiB"


# --- reading the machine and the state dir -------------------------------------------------------------------

def read(sysfs_root: Path) -> dict[str, GpuState]:
    gpus = {}
    for gpu in discover(sysfs_root):
        chain = pci.upstream(sysfs_root, gpu.pci)
        top = chain[0] if chain else None
        device = pci.device_dir(sysfs_root, gpu.pci)
        model = _text(device / "product_name") or (f"{top.vendor or 0:04x}:{top.device or 0:04x}" if top else "?")
        root = chain[-1] if len(chain) > 1 else None
        gpus[gpu.pci] = GpuState(
            gpu.pci, gpu.vendor, model, gpu.driver,
            tuple((index, size) for index, size, _ in pci.bars(sysfs_root, gpu.pci)),
            tuple((n.bdf, n.speed_gts, n.width) for n in chain),
            root.pcie.atomic_completer if root and root.pcie else None)
    return gpus


def boot_id(path: Path = BOOT_ID) -> str:
    return path.read_text().strip()


def load_baseline(path: Path) -> tuple[str, float, dict[str, GpuState]] | None:
    """(boot id, time, GPUs) as recorded, or None (none yet, or unreadable: then it is written afresh)."""
    try:
        data = json.loads(path.read_text())
        gpus = {k: GpuState(**{**v, "bars": tuple(map(tuple, v["bars"])), "links": tuple(map(tuple, v["links"]))})
                for k, v in data["gpus"].items()}
        return data["boot"], float(data["time"]), gpus
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("GPU baseline %s unreadable (%s): recording it afresh", path, exc)
        return None


def save_baseline(path: Path, boot: str, at: float, gpus: dict[str, GpuState]) -> None:
    data = {"boot": boot, "time": at, "gpus": {k: asdict(v) for k, v in gpus.items()}}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


@dataclass(frozen=True)
class Loss:
    """A GPU lost before this boot and not back since."""

    gpu: str | None
    incident: str | None  # the incident that told it


def still_lost(state: conditions.State, open_incidents: Iterable[Incident], until: float) -> list[Loss]:
    """The GPUs lost before `until` (this boot's start) and not back since: the open gpu_lost conditions, the
    model's truth, each with the open incident that holds it. A loss that ended before the reboot (the GPU came
    back on the bus) is no loss to confirm."""
    held = {key: i.id for i in open_incidents for key in i.conditions}
    return [Loss(c.gpu, held.get(c.key)) for c in state.values()
            if c.key.kind == conditions.Kind.GPU_LOST and c.since < until]


def boot_began() -> float:
    """When this boot began, epoch seconds: a loss before it is one the reboot may have cured."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


# --- at the start of the daemon ------------------------------------------------------------------------------

class Recovery:
    """Run once at the start: record the baseline on a new boot, or, when the last boot lost a GPU, wait for the
    GPUs and report whether they are back as before."""

    def __init__(self, state_dir: Path, sysfs_root: Path, losses: list[Loss],
                 record: Callable[[list[Event]], Any], boot_path: Path = BOOT_ID, wait: float = WAIT,
                 every: float = EVERY) -> None:
        """`losses`: the GPUs lost before this boot began and still lost (`still_lost(..., boot_began())` on
        the hub's open conditions, as the store held them at the start: given, not asked of the hub); `record`:
        where the verdict goes (the hub, which ends those conditions and their incident with it)."""
        self.path, self.sysfs_root, self.losses, self.record = state_dir / BASELINE, sysfs_root, losses, record
        self.boot_path, self.wait, self.every = boot_path, wait, every

    async def run(self) -> Event | None:
        boot, now = await self._off(boot_id, self.boot_path), time.time()
        baseline = await self._off(load_baseline, self.path)
        if baseline is not None and baseline[0] == boot:
            return None  # a restart of the daemon within the boot: the baseline is this boot's already
        if baseline is None:
            await self._save(boot, now)
            return None
        losses = self.losses
        if not losses:
            await self._save(boot, now)
            return None
        lost = sorted({loss.gpu for loss in losses if loss.gpu})
        incident = next((loss.incident for loss in losses if loss.incident), None)
        log.info("the last boot lost GPU(s) %s: comparing the GPUs with the baseline of %s", ", ".join(lost) or "?",
                 time.strftime("%Y-%m-%d %H:%M", time.localtime(baseline[1])))
        started = time.monotonic()
        while True:
            gpus = await self._off(read, self.sysfs_root)
            verdict = compare(baseline[2], gpus)
            if verdict.as_before or time.monotonic() - started >= self.wait:
                break
            await asyncio.sleep(self.every)
        event = verdict_event(verdict, incident, lost, time.time(), gpus)
        if verdict.as_before:
            await self._save(boot, now)
        else:  # the baseline stays the one from before the fault, checked against again after the next reboot
            log.warning("%s", event.message)
            await self._off(save_baseline, self.path, boot, baseline[1], baseline[2])
        self.record([event])
        return event

    async def _save(self, boot: str, at: float) -> None:
        gpus = await self._off(read, self.sysfs_root)
        await self._off(save_baseline, self.path, boot, at, gpus)
        log.info("GPU baseline recorded: %d GPU(s)", len(gpus))

    @staticmethod
    async def _off(fn, *args):
        return await _READS.run("recovery", _READ_DEADLINE, fn, *args)

