"""`gpuwarden install --root DIR`, run for real as a packager stages it: the unit (its ExecStart naming where
gpuwarden is, checked by systemd-analyze verify), the configuration (issue 24, finding 9: `make install` wrote it
0644, the file where alert tokens go), the man page and the bash completion, with their modes, and `gpuwarden` on
PATH (a link: the README's next step after an install is `gpuwarden check`, which a new user found missing)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import GPUWARDEN

ROOT = Path(__file__).resolve().parents[2]
EXE = str(Path(sys.executable).with_name("gpuwarden"))  # this venv's console script


def install(root: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUWARDEN, "install", "--root", str(root), *extra], capture_output=True, text=True,
                          timeout=60)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_install_places_unit_config_man_page_and_completion_with_their_modes(tmp_path):
    done = install(tmp_path, "--prefix", "/usr")
    assert done.returncode == 0, done.stderr
    unit = tmp_path / "etc/systemd/system/gpuwarden.service"
    config = tmp_path / "etc/gpuwarden/gpuwarden.toml"
    man = tmp_path / "usr/share/man/man1/gpuwarden.1"
    completion = tmp_path / "usr/share/bash-completion/completions/gpuwarden"
    assert (mode(unit), mode(config), mode(man), mode(completion)) == (0o644, 0o600, 0o644, 0o644)
    assert config.read_text() == (ROOT / "config" / "gpuwarden.toml").read_text()
    text = unit.read_text()
    assert f"ExecStart={EXE} run\n" in text and f"ExecReload={EXE} reload --pid $MAINPID\n" in text
    assert "/opt/gpuwarden" not in text and "Documentation=man:gpuwarden(1)" in text
    assert man.read_text().startswith(".TH GPUWARDEN 1") and "complete -o bashdefault" in completion.read_text()
    assert f"placed {unit} (mode 644)" in done.stdout
    command = tmp_path / "usr/bin/gpuwarden"  # the command the man page and the completion name, on PATH
    assert command.is_symlink() and os.readlink(command) == EXE
    assert subprocess.run([command, "--version"], capture_output=True, text=True, timeout=60).returncode == 0
    assert f"linked {command} -> {EXE}" in done.stdout


def test_another_installations_command_on_path_is_kept_and_left(tmp_path):
    """pip installing gpuwarden into the system's Python puts its own script at /usr/local/bin/gpuwarden: install
    links nothing over it, and uninstall leaves it; a link there (an earlier install's) is replaced, then removed."""
    command = tmp_path / "usr/local/bin/gpuwarden"
    command.parent.mkdir(parents=True)
    command.write_text("#!/bin/sh\necho pip's own\n")
    command.chmod(0o755)
    done = install(tmp_path)
    assert done.returncode == 0, done.stderr
    assert not command.is_symlink() and "pip's own" in command.read_text()
    assert f"kept the existing {command} (mode 755)" in done.stdout
    undone = subprocess.run([*GPUWARDEN, "uninstall", "--root", str(tmp_path)], capture_output=True, text=True,
                            timeout=60)
    assert undone.returncode == 0 and command.is_file() and str(command) not in undone.stdout, undone.stdout
    command.unlink()
    command.symlink_to("/old/install/bin/gpuwarden")
    assert install(tmp_path).returncode == 0 and os.readlink(command) == EXE
    undone = subprocess.run([*GPUWARDEN, "uninstall", "--root", str(tmp_path)], capture_output=True, text=True,
                            timeout=60)
    assert f"removed {command}" in undone.stdout and not os.path.lexists(command)


def test_a_command_installed_at_the_links_own_place_is_not_linked_to_itself(tmp_path):
    done = install(tmp_path, "--exec", "/usr/local/bin/gpuwarden")
    assert done.returncode == 0, done.stderr
    assert not os.path.lexists(tmp_path / "usr/local/bin/gpuwarden") and "linked" not in done.stdout


def test_the_placed_unit_passes_systemd_analyze_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        pytest.fail("systemd-analyze is not installed (make test-deps installs systemd)")
    assert install(tmp_path).returncode == 0
    unit = tmp_path / "etc/systemd/system/gpuwarden.service"
    # verify runs `man gpuwarden(1)` for Documentation=: the man page placed under the root must be the one found
    env = {**os.environ, "MANPATH": str(tmp_path / "usr/local/share/man")}
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60, env=env)
    problems = [line for line in (result.stdout + result.stderr).splitlines() if "gpuwarden.service" in line]
    assert result.returncode == 0 and not problems, result.stdout + result.stderr


def test_exec_names_the_final_path_while_files_land_under_the_root(tmp_path):
    """A packager's stage: the venv will live at /usr/lib/gpuwarden, the files are written under DESTDIR."""
    done = install(tmp_path, "--exec", "/usr/lib/gpuwarden/bin/gpuwarden")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "etc/systemd/system/gpuwarden.service").read_text()
    assert "ExecStart=/usr/lib/gpuwarden/bin/gpuwarden run\n" in text
    assert (tmp_path / "usr/local/share/man/man1/gpuwarden.1").is_file()  # the default prefix
    refused = install(tmp_path, "--exec", "bin/gpuwarden")
    assert refused.returncode == 1 and "absolute path" in refused.stderr


@pytest.mark.parametrize(("before", "after"), [(0o644, 0o600), (0o640, 0o600), (0o400, 0o400), (0o600, 0o600)])
def test_an_existing_config_is_kept_and_only_tightened(tmp_path, before, after):
    config = tmp_path / "etc" / "gpuwarden" / "gpuwarden.toml"
    config.parent.mkdir(parents=True)
    config.write_text("# the admin's own\n")
    config.chmod(before)
    done = install(tmp_path)
    assert done.returncode == 0, done.stderr
    assert config.read_text() == "# the admin's own\n" and mode(config) == after
    assert f"kept the existing {config} (mode {after:o})" in done.stdout


def test_make_install_honours_destdir_and_prefix(tmp_path):
    """The Makefile's install into a stage: the venv at DESTDIR+PREFIX, the unit naming PREFIX."""
    make = shutil.which("make")
    if not make:
        pytest.fail("make is not installed")
    stage, prefix = tmp_path / "stage", "/usr/lib/gpuwarden"
    done = subprocess.run([make, "-s", "-C", str(ROOT), "install", f"DESTDIR={stage}", f"PREFIX={prefix}",
                           "DATAPREFIX=/usr", "SUDO=", f"PYTHON={sys.executable}"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (stage / prefix.lstrip("/") / "bin" / "gpuwarden").is_file()
    unit = (stage / "etc/systemd/system/gpuwarden.service").read_text()
    assert f"ExecStart={prefix}/bin/gpuwarden run\n" in unit and str(stage) not in unit
    assert mode(stage / "etc/gpuwarden/gpuwarden.toml") == 0o600
    assert (stage / "usr/share/bash-completion/completions/gpuwarden").is_file()
    assert os.readlink(stage / "usr/bin/gpuwarden") == f"{prefix}/bin/gpuwarden"  # where it will be, not the stage


def test_the_placed_unit_serves_the_watchdog_first(tmp_path):
    """Issue 36: on a loaded box the watchdog must not queue behind the load it watches: scheduling, I/O and
    OOM priority in the unit (docs/service.md "Priority"; the running daemon's values: test_real_systemd.py)."""
    assert install(tmp_path).returncode == 0
    lines = (tmp_path / "etc/systemd/system/gpuwarden.service").read_text().splitlines()
    service = lines[lines.index("[Service]"):lines.index("[Install]")]
    settings = dict(line.split("=", 1) for line in service if "=" in line and not line.startswith("#"))
    assert {k: settings.get(k) for k in ("Nice", "CPUWeight", "IOWeight", "IOSchedulingClass", "IOSchedulingPriority",
                                          "MemoryLow", "OOMScoreAdjust")} == {
        "Nice": "-10", "CPUWeight": "1000", "IOWeight": "1000", "IOSchedulingClass": "best-effort",
        "IOSchedulingPriority": "0", "MemoryLow": "64M", "OOMScoreAdjust": "-900"}
    assert "CPUSchedulingPolicy" not in settings and "CPUQuota" not in settings  # never real-time, never throttled
