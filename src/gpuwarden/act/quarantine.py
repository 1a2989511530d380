"""Poisoned compile caches: find zero-byte files, and move a poisoned cache aside (never delete it).

A power cut during an engine's first compile leaves zero-byte files in the torch/inductor/triton/vLLM
caches; the engine then dies silently every few minutes. Renaming the cache to
`<dir>.BROKEN-<YYYYmmdd-HHMMSS>-<reason>` makes the engine recompile and keeps the evidence.
"""

from __future__ import annotations

import os
import pwd
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuwarden.config import CacheConfig
from gpuwarden.model import Event, Severity

# Where engines keep compiled artefacts, per user ({home}, {user}). Missing ones are skipped.
CACHE_TEMPLATES = (
    "{home}/.cache/vllm",  # vLLM's torch.compile cache (torch_compile_cache/)
    "{home}/.triton/cache",  # Triton kernels
    "/tmp/torchinductor_{user}",  # TorchInductor's default cache
    "{home}/.cache/torch/kernels",
    "{home}/.cache/miopen",  # MIOpen (ROCm) kernel cache
    "{home}/.cache/flashinfer",
)
_EXAMPLES = 5  # zero-byte files named in a finding or event


@dataclass(frozen=True)
class Poisoned:
    """A cache directory holding zero-byte files."""

    dir: Path
    count: int
    examples: tuple[str, ...] = field(default=())  # paths relative to `dir`


def cache_dirs(config: CacheConfig) -> list[Path]:
    return list(config.dirs) if config.dirs is not None else default_dirs()


def default_dirs() -> list[Path]:
    """The cache templates for root and for every login user (uid >= 1000) whose home exists."""
    dirs: list[Path] = []
    for user in pwd.getpwall():
        if (user.pw_uid == 0 or user.pw_uid >= 1000) and os.path.isdir(user.pw_dir):
            dirs += [Path(t.format(home=user.pw_dir, user=user.pw_name)) for t in CACHE_TEMPLATES]
    return list(dict.fromkeys(dirs))


def scan(dirs: list[Path]) -> list[Poisoned]:
    """Every directory in `dirs` that holds a zero-byte regular file other than a `*.lock` (links not followed)."""
    found = []
    for top in dirs:
        empty: list[str] = []
        for folder, _, files in os.walk(top):
            for name in files:
                if name.endswith(".lock"):
                    continue
                path = os.path.join(folder, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue  # gone while we looked
                if st.st_size == 0 and stat.S_ISREG(st.st_mode):
                    empty.append(os.path.relpath(path, top))
        if empty:
            empty.sort()
            found.append(Poisoned(top, len(empty), tuple(empty[:_EXAMPLES])))
    return found


def broken_name(directory: Path, reason: str, now: float) -> Path:
    """`<dir>.BROKEN-<YYYYmmdd-HHMMSS>-<reason>`, the reason reduced to letters, digits, '-' and '_'."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", reason).strip("-")[:40] or "manual"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return directory.with_name(f"{directory.name}.BROKEN-{stamp}-{slug}")


def quarantine(directory: Path, reason: str, now: float, dry_run: bool = False) -> Path:
    """Rename `directory` aside and return the new name; with `dry_run`, only say what the name would be.

    A rename within one filesystem is atomic: the engine sees either the old cache or none.
    """
    target = broken_name(directory, reason, now)
    if target.exists():
        raise FileExistsError(f"{target} exists already")
    if not dry_run:
        directory.rename(target)
    return target


def quarantine_all(dirs: list[Path], reason: str, now: float, dry_run: bool = False) -> Event | None:
    """Move aside every poisoned cache among `dirs`; the `cache_poisoned` event that says what moved, or None."""
    return moved_event(scan(dirs), reason, now, dry_run)


def moved_event(poisoned: list[Poisoned], reason: str, now: float, dry_run: bool = False) -> Event | None:
    """Quarantine each of `poisoned` and describe the outcome; a directory that cannot be moved is said so."""
    if not poisoned:
        return None
    moves, failures = [], []
    for p in poisoned:
        try:
            moves.append({"dir": str(p.dir), "to": str(quarantine(p.dir, reason, now, dry_run)),
                          "zero_byte_files": p.count, "examples": list(p.examples)})
        except OSError as exc:
            failures.append({"dir": str(p.dir), "error": exc.strerror or str(exc)})
    files = sum(p.count for p in poisoned)
    verb = "would move" if dry_run else "moved"
    what = "; ".join(f"{m['dir']} -> {m['to']}" for m in moves) or "nothing"
    message = f"{files} zero-byte file(s) in compile caches ({reason}): {verb} {what}"
    if failures:
        message += "; could not move " + ", ".join(f"{f['dir']} ({f['error']})" for f in failures)
    return Event("cache_poisoned", Severity.CRITICAL if failures else Severity.WARNING, message, now,
                 evidence={"moved": moves, "failed": failures, "reason": reason, "dry_run": dry_run,
                           "runbook": "cache_poisoned"})
