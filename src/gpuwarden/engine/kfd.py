"""AMD KFD's per-process pasids: which GPU address space (the `pasid` an amdgpu fault line names) belongs to which
process. amdkfd/kfd_process.c makes /sys/class/kfd/kfd/proc/<pid>/pasid for every process that opened
/dev/kfd (every ROCm process), and removes it when the process's KFD state is released. Blocking: called in
the engine's process look-up, off the loop."""

from __future__ import annotations

from pathlib import Path

KFD_PROCS = Path("/sys/class/kfd/kfd/proc")


def pasids_of(pids: list[int], root: Path = KFD_PROCS) -> frozenset[int] | None:
    """The pasids of these processes; None when the kernel exposes none to read (no KFD, no sysfs): then a
    pasid cannot be resolved to anyone. A process that did not open /dev/kfd has none."""
    if not root.is_dir():
        return None
    found = set()
    for pid in pids:
        try:
            pasid = int((root / str(pid) / "pasid").read_text().strip())
        except (OSError, ValueError):
            continue
        if pasid > 0:
            found.add(pasid)
    return frozenset(found)
