"""Poisoned compile caches on a real directory tree: what counts as poisoned, and that nothing is deleted."""

import os
import time

import pytest

from gpuwarden.act.quarantine import Poisoned, broken_name, moved_event, quarantine, quarantine_all, scan


def tree(root):
    """A triton cache with two power-cut files, a lock file, a link to an empty file and an empty FIFO."""
    cache = root / ".triton" / "cache"
    (cache / "ab12").mkdir(parents=True)
    (cache / "ab12" / "kernel.hsaco").write_bytes(b"\x7fELF")
    (cache / "ab12" / "kernel.json").touch()
    (cache / "cd34").mkdir()
    (cache / "cd34" / "kernel.hsaco").touch()
    (cache / "cd34" / "write.lock").touch()
    (root / "outside").touch()
    os.symlink(root / "outside", cache / "link-to-empty")
    os.mkfifo(cache / "fifo")
    return cache


def files_under(path):
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs)


def test_scan_counts_zero_byte_regular_files_but_not_locks_links_or_fifos(tmp_path):
    cache = tree(tmp_path)
    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "x").write_text("x")
    [found] = scan([cache, clean, tmp_path / "missing"])
    assert found == Poisoned(cache, 2, ("ab12/kernel.json", "cd34/kernel.hsaco"))


def test_quarantine_renames_and_deletes_nothing(tmp_path):
    cache = tree(tmp_path)
    before = files_under(cache)
    now = time.mktime((2026, 12, 2, 19, 30, 5, 0, 0, -1))
    event = quarantine_all([cache], "crash loop!", now)
    broken = tmp_path / ".triton" / "cache.BROKEN-20261202-193005-crash-loop"
    assert not cache.exists() and files_under(broken) == before
    assert event.kind == "cache_poisoned" and str(event.severity) == "warning"
    assert event.evidence["moved"] == [{"dir": str(cache), "to": str(broken), "zero_byte_files": 2,
                                        "examples": ["ab12/kernel.json", "cd34/kernel.hsaco"]}]
    assert "moved" in event.message and str(broken) in event.message


def test_dry_run_moves_nothing(tmp_path):
    cache = tree(tmp_path)
    event = quarantine_all([cache], "manual", time.time(), dry_run=True)
    assert cache.exists() and not list(cache.parent.glob("cache.BROKEN-*"))
    assert "would move" in event.message and event.evidence["dry_run"]


def test_a_directory_that_cannot_move_is_critical_and_said(tmp_path):
    cache = tree(tmp_path)
    now = time.time()
    broken_name(cache, "manual", now).mkdir()  # the name is taken: never overwrite earlier evidence
    with pytest.raises(FileExistsError):
        quarantine(cache, "manual", now)
    event = moved_event([Poisoned(cache, 2)], "manual", now)
    assert str(event.severity) == "critical" and "could not move" in event.message and cache.exists()


def test_nothing_poisoned_is_no_event(tmp_path):
    assert quarantine_all([tmp_path], "manual", time.time()) is None
