"""Findings 4 and 5 of issue 13: a local user points its compile caches at what is not theirs, and root's
gpuwarden, which renames poisoned caches, must not follow. Every folder that could be moved is one the test
made (a root-owned one under the test's own tmp_path); /var is only ever shown a dry run."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import GPUWARDEN

pytestmark = pytest.mark.root

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "gpuwarden.service"


def gpuwarden(tmp_path, *args, dirs=None, prefix=()) -> subprocess.CompletedProcess:
    config = tmp_path / "gpuwarden.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                      + (f"[cache]\ndirs = {json.dumps([str(d) for d in dirs])}\n" if dirs is not None else ""))
    return subprocess.run([*prefix, *GPUWARDEN, "--config", str(config), *args], capture_output=True, text=True,
                          timeout=60)


def stored_events(tmp_path) -> str:
    out = gpuwarden(tmp_path, "events", "--jsonl", "--since", "1d")
    return out.stdout


def root_folder(tmp_path, name="rootdir", mode=0o755) -> Path:
    """A root-owned folder holding a `cache` with a zero-byte file: what the attacker wants moved."""
    folder = tmp_path / name
    (folder / "cache").mkdir(parents=True)
    (folder / "cache" / "kernel.so").touch()
    (folder / "cache" / "real.bin").write_bytes(b"x")
    folder.chmod(mode)
    tmp_path.chmod(0o755)  # the attacker's link must resolve for the old code to follow it
    return folder


def test_a_link_in_the_users_cache_path_to_a_root_folder_moves_nothing(attacker, tmp_path):
    """Finding 4: ~/.triton -> a root-owned folder; before, root renamed that folder's `cache`."""
    folder = root_folder(tmp_path)
    attacker.run("ln", "-s", str(folder), str(attacker.home / ".triton"))
    out = gpuwarden(tmp_path, "quarantine", str(attacker.home / ".triton" / "cache"))
    assert out.returncode == 1
    assert f"refused: {attacker.home}/.triton is a symbolic link (to {folder})" in out.stdout
    assert sorted(p.name for p in folder.iterdir()) == ["cache"]
    assert sorted(p.name for p in (folder / "cache").iterdir()) == ["kernel.so", "real.bin"]


def test_a_link_to_var_is_not_offered_even_in_a_dry_run(attacker, tmp_path):
    """Finding 4: ~/.triton -> /var; before, the dry run offered to move /var/cache (stock Debian keeps a
    zero-byte /var/cache/debconf/passwords.dat) and named only the link."""
    attacker.run("ln", "-s", "/var", str(attacker.home / ".triton"))
    cache = attacker.home / ".triton" / "cache"
    out = gpuwarden(tmp_path, "quarantine", "--dry-run", dirs=[cache])
    assert "would move" not in out.stdout and "refused" in out.stdout, out.stdout
    assert f"{attacker.home}/.triton is a symbolic link (to /var)" in out.stdout
    assert os.path.isdir("/var/cache")


def test_a_link_to_a_private_root_folder_records_none_of_its_names(attacker, tmp_path):
    """Finding 4: /tmp/torchinductor_<user> -> a private root folder (/root in the issue); before, root walked
    it and stored its file names in the event."""
    secret = tmp_path / "private"
    secret.mkdir(mode=0o700)
    (secret / "root-secret-name.bin").touch()
    (secret / "another-secret").mkdir()
    (secret / "another-secret" / "key-material").touch()
    tmp_path.chmod(0o755)
    link = Path(f"/tmp/torchinductor_{attacker.name}")
    if link.is_symlink() or link.exists():
        link.unlink() if link.is_symlink() else shutil.rmtree(link)
    try:
        attacker.run("ln", "-s", str(secret), str(link))
        out = gpuwarden(tmp_path, "quarantine", "--dry-run", dirs=[link])
        assert f"refused: {link} is a symbolic link" in out.stdout, out.stdout
        everything = out.stdout + out.stderr + stored_events(tmp_path)
        assert "secret" not in everything.replace(str(secret), "")
        assert "key-material" not in everything
    finally:
        link.unlink()


def test_a_component_owned_by_another_user_is_refused(attacker, tmp_path):
    """A root cache under a folder the user owns: the user could swap what root walks through."""
    tmp_path.chmod(0o755)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, attacker.uid, attacker.gid)
    (theirs / "cache").mkdir()
    (theirs / "cache" / "empty").touch()
    out = gpuwarden(tmp_path, "quarantine", str(theirs / "cache"))
    assert out.returncode == 1
    assert f"{theirs} belongs to {attacker.name}, not root or the cache's owner root" in out.stdout
    assert (theirs / "cache" / "empty").exists()


def unit_capabilities() -> list[str]:
    line = next(x for x in UNIT.read_text().splitlines() if x.startswith("CapabilityBoundingSet="))
    return line.split("=", 1)[1].split()


def as_the_unit() -> list[str]:
    """setpriv with the unit's exact capability bounding set and NoNewPrivileges, as root."""
    caps = ",".join(f"+{c.removeprefix('CAP_').lower()}" for c in unit_capabilities())
    return ["setpriv", f"--bounding-set=-all,{caps}", "--inh-caps=-all", "--no-new-privs", "--"]


def test_the_units_capabilities_are_what_setpriv_gives():
    """The harness itself: under as_the_unit() a process holds exactly the unit's capabilities."""
    status = subprocess.run([*as_the_unit(), "cat", "/proc/self/status"], capture_output=True, text=True,
                            check=True).stdout
    effective = int(re.search(r"^CapEff:\s*([0-9a-f]+)", status, re.M)[1], 16)
    names = subprocess.run(["setpriv", "--list-caps"], capture_output=True, text=True, check=True).stdout.split()
    have = {f"CAP_{n.upper()}" for bit, n in enumerate(names) if effective >> bit & 1}
    assert have == set(unit_capabilities())
    assert "NoNewPrivs:\t1" in status


def test_quarantine_works_under_the_units_capabilities(attacker, tmp_path):
    """Finding 5: the user's own poisoned caches (in its 0700 home, and in sticky /tmp) are moved by root
    holding only the unit's capabilities; before, "Permission denied"."""
    home_cache = attacker.home / ".cache" / "vllm"
    tmp_cache = Path(f"/tmp/torchinductor_{attacker.name}")
    for cache in (home_cache, tmp_cache):
        attacker.run("mkdir", "-p", str(cache / "fx"))
        attacker.run("touch", str(cache / "fx" / "a.so"))
    attacker.home.chmod(0o700)
    try:
        out = gpuwarden(tmp_path, "quarantine", "--reason", "test", str(home_cache), str(tmp_cache),
                        prefix=as_the_unit())
        assert out.returncode == 0, out.stdout + out.stderr
        for cache in (home_cache, tmp_cache):
            [moved] = cache.parent.glob(f"{cache.name}.BROKEN-*-test")
            assert not cache.exists() and (moved / "fx" / "a.so").exists()
            assert moved.stat().st_uid == attacker.uid
    finally:
        for leftover in Path("/tmp").glob(f"torchinductor_{attacker.name}*"):
            shutil.rmtree(leftover)


def test_the_move_never_replaces_an_existing_name(attacker, tmp_path):
    """The user plants the quarantine name as a link to a root folder: the rename must not land on it."""
    cache = attacker.home / ".cache" / "vllm"
    attacker.run("mkdir", "-p", str(cache))
    attacker.run("touch", str(cache / "empty.so"))
    folder = root_folder(tmp_path)
    out = gpuwarden(tmp_path, "quarantine", "--dry-run", "--reason", "race", str(cache))
    planted = Path(re.search(r"-> (\S+)", out.stdout)[1])
    attacker.run("ln", "-s", str(folder), str(planted))
    out = gpuwarden(tmp_path, "quarantine", "--reason", "race", str(cache))
    if planted.name in out.stdout:  # the same second: the name is taken, nothing moves
        assert out.returncode == 1 and "File exists" in out.stdout and cache.exists()
    assert planted.is_symlink() and sorted(p.name for p in folder.iterdir()) == ["cache"]
