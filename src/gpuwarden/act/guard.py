"""The recovery guard: make a GPU's dangerous sysfs files read-only by bind-mounting each over itself and
remounting it read-only (writes then fail with EROFS), verify it, and release exactly what was applied.

The guard lives in the mount namespace it was made in, so the daemon must run in the host's (no systemd
sandboxing). It vanishes when the kernel recreates a node (driver reload, PCI rescan) while mountinfo may
still list it, so it is verified by opening each path and comparing the mount id it lands on.
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass
from pathlib import Path

MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
DEVICE_FILES = ("driver_override", "remove", "reset", "reset_method")
DRIVER_FILES = ("bind", "unbind")

_libc = ctypes.CDLL(None, use_errno=True)


class GuardError(Exception):
    pass


def guarded_paths(device: str, sysfs_root: Path = Path("/sys")) -> list[Path]:
    """The files that unbind, rebind, remove, reset or resize `device`, by their real (resolved) paths."""
    dev = (sysfs_root / "bus/pci/devices" / device).resolve()
    if not dev.is_dir():
        return []
    paths = [dev / f for f in DEVICE_FILES] + sorted(dev.glob("resource*_resize"))
    driver = dev / "driver"
    if driver.exists():
        paths += [driver.resolve() / f for f in DRIVER_FILES]
    paths.append((sysfs_root / "bus/pci/drivers_probe").resolve())
    return [p for p in paths if p.exists()]


def paths_for(devices: list[str], sysfs_root: Path = Path("/sys")) -> list[Path]:
    """Every guarded file of these devices, once (GPUs on one driver share its bind and unbind)."""
    return list(dict.fromkeys(p for d in devices for p in guarded_paths(d, sysfs_root)))


def mount_id(path: Path) -> int:
    """The id of the mount that opening `path` lands on (from /proc/self/fdinfo)."""
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
            if line.startswith("mnt_id:"):
                return int(line.split()[1])
    finally:
        os.close(fd)
    raise GuardError(f"{path}: no mnt_id in fdinfo")


def read_only_mounts() -> set[int]:
    """Ids of the read-only mounts in this namespace."""
    ids = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if "ro" in fields[5].split(","):
            ids.add(int(fields[0]))
    return ids


def _mount(source: str | None, target: str, flags: int) -> None:
    if _libc.mount(source and source.encode(), target.encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise GuardError(f"mount {target}: {os.strerror(err)}")


def apply(path: Path) -> int:
    """Guard one file; returns the guard's mount id."""
    target = str(path)
    _mount(target, target, MS_BIND)
    try:
        _mount(None, target, MS_REMOUNT | MS_BIND | MS_RDONLY)
    except GuardError:
        _libc.umount2(target.encode(), 0)
        raise
    return mount_id(path)


def release(path: Path) -> bool:
    """Remove a guard; False when none was there (already gone with its node)."""
    if _libc.umount2(str(path).encode(), 0) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOENT):
        return False
    raise GuardError(f"umount {path}: {os.strerror(err)}")


def is_guarded(path: Path, sysfs_mount: int) -> bool:
    """True when opening `path` lands on a read-only mount of its own, not on sysfs itself."""
    try:
        landed = mount_id(path)
    except (OSError, GuardError):
        return False
    return landed != sysfs_mount and landed in read_only_mounts()


@dataclass(eq=False, repr=False)
class Guard:
    """The guards this process applied, by path, with their mount ids."""

    sysfs_root: Path
    applied: dict[Path, int]

    @classmethod
    def new(cls, sysfs_root: Path) -> Guard:
        if os.geteuid() != 0:
            raise GuardError("the recovery guard needs root (it bind-mounts over sysfs files)")
        return cls(sysfs_root, {})

    @property
    def sysfs_mount(self) -> int:
        return mount_id(self.sysfs_root)

    def ensure(self, paths: list[Path]) -> list[Path]:
        """Apply the guard where it is missing; returns the paths where an earlier guard of ours was lost.

        A guard already in place that this process did not make (left by a gpuwarden that was killed, or by
        `gpuwarden guard apply`) is adopted: it is released on stop like the others.
        """
        sysfs = self.sysfs_mount
        lost = []
        for path in paths:
            if is_guarded(path, sysfs):
                self.applied.setdefault(path, mount_id(path))
                continue
            if path in self.applied:
                lost.append(path)
                release(path)  # a detached leftover, if any
            self.applied[path] = apply(path)
        return lost

    def release_all(self) -> list[Path]:
        released = [p for p in self.applied if release(p)]
        self.applied.clear()
        return released


def status(paths: list[Path], sysfs_root: Path) -> list[tuple[Path, bool]]:
    sysfs = mount_id(sysfs_root)
    return [(p, is_guarded(p, sysfs)) for p in paths]
