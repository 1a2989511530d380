"""Poisoned compile caches: find zero-byte files, and move a poisoned cache aside (never delete it).

A power cut during an engine's first compile leaves zero-byte files in the torch/inductor/triton/vLLM
caches; the engine then dies silently every few minutes. Renaming the cache to
`<dir>.BROKEN-<YYYYmmdd-HHMMSS>-<reason>` makes the engine recompile and keeps the evidence.

Root does this in users' homes and in /tmp, so a cache is reached from / one component at a time with
O_NOFOLLOW, never through a symbolic link, and only through directories owned by root or by the cache's own
user (the owner of the cache directory): what root renames is then something that user could rename, and
what it reads and records are names inside that cache. The rename goes through the verified parent's file
descriptor (renameat2, never replacing an existing name).
"""

from __future__ import annotations

import ctypes
import errno
import os
import pwd
import re
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpuwarden import enginekinds
from gpuwarden.config.settings import CacheConfig
from gpuwarden.core.counts import plural
from gpuwarden.core.model import Event, Severity

# Where the libraries engines share keep compiled artefacts, per user ({home}, {user}); each engine kind adds its
# own (its `caches`). Missing ones are skipped.
SHARED_CACHES = (
    "{home}/.triton/cache",  # Triton kernels
    "/tmp/torchinductor_{user}",  # TorchInductor's default cache
    "{home}/.cache/torch/kernels",
    "{home}/.cache/miopen",  # MIOpen (ROCm) kernel cache
    "{home}/.cache/flashinfer",
)
_EXAMPLES = 5  # zero-byte files named in a finding or event
_RENAME_NOREPLACE = 1  # linux/fs.h
_libc = ctypes.CDLL(None, use_errno=True)


class Unsafe(Exception):
    """A cache path that root must not walk or rename; `str()` says why."""


@dataclass(frozen=True)
class Poisoned:
    """A cache directory holding zero-byte files, or one refused (`refused` says why; nothing was read)."""

    dir: Path
    count: int
    examples: tuple[str, ...] = field(default=())  # paths relative to `dir`
    refused: str = ""


def cache_dirs(config: CacheConfig, owner: int | None = None) -> list[Path]:
    """The caches to look at: [cache] dirs, else the usual ones of `owner` (None: of root and every login
    user, for a person's `gpuwarden quarantine`)."""
    return list(config.dirs) if config.dirs is not None else default_dirs(owner)


def default_dirs(owner: int | None = None) -> list[Path]:
    """The cache templates for `owner`, or for root and for every login user (uid >= 1000) whose home exists."""
    dirs: list[Path] = []
    for user in pwd.getpwall():
        wanted = user.pw_uid == owner if owner is not None else user.pw_uid == 0 or user.pw_uid >= 1000
        if wanted and os.path.isdir(user.pw_dir):
            dirs += [Path(t.format(home=user.pw_dir, user=user.pw_name)) for t in cache_templates()]
    return list(dict.fromkeys(dirs))


def cache_templates() -> tuple[str, ...]:
    return (*(c for k in enginekinds.all_kinds() for c in k.caches), *SHARED_CACHES)


@contextmanager
def opened(directory: Path) -> Iterator[tuple[int, int]]:
    """(parent fd, directory fd), both O_PATH, reached from / without following a link; raises Unsafe when a
    component is a link or not a directory, or is owned by someone other than root or the directory's owner,
    and FileNotFoundError when it is not there."""
    path = Path(os.path.abspath(directory))  # lexical: with no link on the way, it is the real path
    fds = [os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)]
    try:
        owners = [(Path("/"), os.fstat(fds[0]).st_uid)]
        for i, name in enumerate(path.parts[1:], 2):
            fds.append(os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fds[-1]))
            st = os.fstat(fds[-1])
            here = Path(*path.parts[:i])
            if stat.S_ISLNK(st.st_mode):
                raise Unsafe(f"{here} is a symbolic link (to {os.readlink(name, dir_fd=fds[-2])})")
            if not stat.S_ISDIR(st.st_mode):
                raise Unsafe(f"{here} is not a directory")
            owners.append((here, st.st_uid))
            if len(fds) > 2:
                os.close(fds.pop(0))  # only the last two are needed
        user = owners[-1][1]
        for here, uid in owners:
            if uid not in (0, user):
                raise Unsafe(f"{here} belongs to {_name(uid)}, not root or the cache's owner {_name(user)}")
        if len(fds) < 2:
            raise Unsafe(f"{path} is the root directory")
        yield fds[-2], fds[-1]
    finally:
        for fd in fds:
            os.close(fd)


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def scan(dirs: list[Path], owner: int | None = None) -> list[Poisoned]:
    """Every directory in `dirs` that holds a zero-byte regular file other than a `*.lock` (links not followed),
    and every one that is there but may not be walked (with why). Missing ones are skipped, and so, when
    `owner` is given (an engine's user), is every cache that is not that user's: an engine's crash loop moves
    its own user's caches, never another's."""
    found = []
    for top in dirs:
        try:
            with opened(top) as (_, fd):
                if owner is not None and os.fstat(fd).st_uid != owner:
                    continue
                empty = sorted(_zero_byte_files(fd))
        except Unsafe as exc:
            found.append(Poisoned(Path(os.path.abspath(top)), 0, refused=str(exc)))
            continue
        except OSError:
            continue  # not there (or not a place we can look)
        if empty:
            found.append(Poisoned(Path(os.path.abspath(top)), len(empty), tuple(empty[:_EXAMPLES])))
    return found


MAX_DEPTH = 64  # folders below a cache's top; compile caches nest a few levels


def _zero_byte_files(dir_fd: int) -> Iterator[str]:
    """Zero-byte regular files below `dir_fd` (an O_PATH descriptor), links not followed. The user shapes this
    tree: it is walked without recursion, holding one descriptor per level, and a tree deeper than MAX_DEPTH is
    Unsafe (os.fwalk recursed, and a tree 1,100 deep ended the walk in a RecursionError)."""
    stack: list[tuple[str, int, Iterator[os.DirEntry]]] = []
    try:
        _enter(stack, "", os.open(".", _DIR_FLAGS, dir_fd=dir_fd))
        while stack:
            folder, fd, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                entries.close()
                os.close(fd)
                continue
            path = os.path.join(folder, entry.name)
            try:
                if entry.is_dir(follow_symlinks=False):
                    if len(stack) > MAX_DEPTH:
                        raise Unsafe(f"it nests folders more than {MAX_DEPTH} deep")
                    _enter(stack, path, os.open(entry.name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd))
                elif (entry.is_file(follow_symlinks=False) and not entry.name.endswith(".lock")
                      and entry.stat(follow_symlinks=False).st_size == 0):
                    yield path
            except OSError:
                continue  # gone while we looked
    finally:
        for _, fd, entries in stack:
            entries.close()
            os.close(fd)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _enter(stack: list, folder: str, fd: int) -> None:
    try:
        stack.append((folder, fd, os.scandir(fd)))
    except OSError:
        os.close(fd)
        raise


def broken_name(directory: Path, reason: str, now: float) -> Path:
    """`<dir>.BROKEN-<YYYYmmdd-HHMMSS>-<reason>`, the reason reduced to letters, digits, '-' and '_'."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", reason).strip("-")[:40] or "manual"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return directory.with_name(f"{directory.name}.BROKEN-{stamp}-{slug}")


def quarantine(directory: Path, reason: str, now: float, dry_run: bool = False) -> Path:
    """Rename `directory` aside and return the new name; with `dry_run`, only say what the name would be.

    A rename within one filesystem is atomic: the engine sees either the old cache or none. Raises Unsafe for a
    path that may not be touched (see `opened`).
    """
    path = Path(os.path.abspath(directory))
    target = broken_name(path, reason, now)
    with opened(path) as (parent, fd):
        there, verified = os.stat(path.name, dir_fd=parent, follow_symlinks=False), os.fstat(fd)
        if (there.st_dev, there.st_ino) != (verified.st_dev, verified.st_ino):
            raise Unsafe(f"{path} changed while it was being moved")
        if dry_run:
            try:
                os.stat(target.name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                return target
            raise FileExistsError(errno.EEXIST, f"{target} exists already")
        if _libc.renameat2(parent, os.fsencode(path.name), parent, os.fsencode(target.name),
                           _RENAME_NOREPLACE) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), str(target))
    return target


def quarantine_all(dirs: list[Path], reason: str, now: float, dry_run: bool = False,
                   owner: int | None = None, engine: str | None = None) -> Event | None:
    """Move aside every poisoned cache among `dirs` (only `owner`'s, when given); the `cache_poisoned` event
    that says what moved, or None."""
    return moved_event(scan(dirs, owner), reason, now, dry_run, engine)


def moved_event(poisoned: list[Poisoned], reason: str, now: float, dry_run: bool = False,
                engine: str | None = None) -> Event | None:
    """Quarantine each of `poisoned` and describe the outcome; a directory that cannot be moved is said so. The
    event names `engine`, whose crash loop moved them: it joins that incident and pages with it."""
    if not poisoned:
        return None
    moves, failures = [], []
    for p in poisoned:
        try:
            if p.refused:
                raise Unsafe(p.refused)
            moves.append({"dir": str(p.dir), "to": str(quarantine(p.dir, reason, now, dry_run)),
                          "zero_byte_files": p.count, "examples": list(p.examples)})
        except Unsafe as exc:
            failures.append({"dir": str(p.dir), "error": f"refused: {exc}"})
        except OSError as exc:
            failures.append({"dir": str(p.dir), "error": exc.strerror or str(exc)})
    files = sum(p.count for p in poisoned)
    verb = "would move" if dry_run else "moved"
    said = [f"{verb} " + "; ".join(f"{m['dir']} -> {m['to']}" for m in moves)] if moves else []
    said += [f"could not move {f['dir']} ({f['error']})" for f in failures]
    message = f"{plural(files, 'zero-byte file')} in compile caches ({reason}): " + ("; ".join(said) or
                                                                                   f"{verb} nothing")
    return Event("cache_poisoned", Severity.CRITICAL if failures else Severity.WARNING, message, now, engine=engine,
                 evidence={"moved": moves, "failed": failures, "reason": reason, "dry_run": dry_run})
