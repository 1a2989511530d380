"""Issue 24, finding 9: `make install` wrote /etc/gpuwarden/gpuwarden.toml 0644, the file where alert tokens go.
The install's config step, run for real into a folder of the test's (CONFDIR)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def install_config(confdir: Path) -> subprocess.CompletedProcess:
    make = shutil.which("make")
    if not make:
        pytest.fail("make is not installed")
    return subprocess.run([make, "-s", "-C", str(ROOT), "install-config", f"CONFDIR={confdir}", "SUDO="],
                          capture_output=True, text=True, timeout=60)


def test_a_new_config_is_written_0600(tmp_path):
    done = install_config(tmp_path / "etc")
    assert done.returncode == 0, done.stderr
    config = tmp_path / "etc" / "gpuwarden.toml"
    assert config.stat().st_mode & 0o777 == 0o600
    assert config.read_text() == (ROOT / "config" / "gpuwarden.toml").read_text()


@pytest.mark.parametrize(("before", "after"), [(0o644, 0o600), (0o640, 0o600), (0o400, 0o400), (0o600, 0o600)])
def test_an_existing_config_is_kept_and_only_tightened(tmp_path, before, after):
    config = tmp_path / "etc" / "gpuwarden.toml"
    config.parent.mkdir()
    config.write_text("# the admin's own\n")
    config.chmod(before)
    done = install_config(config.parent)
    assert done.returncode == 0, done.stderr
    assert config.read_text() == "# the admin's own\n" and config.stat().st_mode & 0o777 == after
    assert f"kept the existing {config} (mode {after:o})" in done.stdout
