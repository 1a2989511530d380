"""A FUSE passthrough of a directory in which chosen files fail their reads with a chosen errno, through
real syscalls: how a GPU that is resetting (EBUSY), off the bus (EREMOTEIO) or removed (ENODEV) answers.

    python tests/faultfs.py SOURCE MOUNTPOINT relative/path=EBUSY ...
"""

import errno
import os
import sys

from fuse import FUSE, FuseOSError, Operations


class FaultFS(Operations):
    def __init__(self, source: str, faults: dict[str, int]) -> None:
        self.source, self.faults = source, faults

    def _real(self, path: str) -> str:
        return os.path.join(self.source, path.lstrip("/"))

    def getattr(self, path, fh=None):
        try:
            st = os.lstat(self._real(path))
        except OSError as exc:
            raise FuseOSError(exc.errno) from None
        return {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_atime",
                                            "st_mtime", "st_ctime")}

    def readdir(self, path, fh):
        return [".", "..", *os.listdir(self._real(path))]

    def readlink(self, path):
        target = os.readlink(self._real(path))
        # links inside the tree point into SOURCE: show them relative to the mount instead
        return os.path.relpath(target, os.path.dirname(self._real(path))) if os.path.isabs(target) else target

    def open(self, path, flags):
        return 0

    def read(self, path, size, offset, fh):
        if path.lstrip("/") in self.faults:
            raise FuseOSError(self.faults[path.lstrip("/")])
        with open(self._real(path), "rb") as f:
            f.seek(offset)
            return f.read(size)


if __name__ == "__main__":
    source, mountpoint, *specs = sys.argv[1:]
    faults = {path: getattr(errno, name) for path, name in (s.split("=") for s in specs)}
    FUSE(FaultFS(source, faults), mountpoint, foreground=True, direct_io=True, nothreads=True)
