"""The wheel as a user gets it: `python -m build` from this checkout, `pip install` of the wheel alone into a fresh
virtualenv (the dependencies from the package index, nothing from the checkout), then that venv's `gpuwarden`
checks a configuration, runs on a kernel log file, answers /metrics, stores the fault line, stops cleanly, and
places its own unit naming itself."""

import json
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import free_port, http_get, wait_for

ROOT = Path(__file__).resolve().parents[2]
XID = "Dec 02 16:22:28 host kernel: NVRM: Xid (PCI:ffff:fe:1f): 79, pid=1, GPU has fallen off the bus.\n"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `python -m build` makes (by way of the sdist, as a release is built)."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, ("`pip install build` (in the test extra)\n" if "No module named build"
                                  in done.stderr else "") + done.stdout[-3000:] + done.stderr[-3000:]
    wheels = list(out.glob("gpuwarden-*.whl"))
    assert len(wheels) == 1 and list(out.glob("gpuwarden-*.tar.gz")), sorted(p.name for p in out.iterdir())
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run([str(venv / "bin/pip"), "install", "-q", str(wheel)], capture_output=True, text=True,
                          timeout=600, cwd=venv)  # not the checkout: nothing of it is importable from there
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


def test_the_wheel_ships_the_unit_and_the_config_example(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"gpuwarden/share/gpuwarden.service", "gpuwarden/share/gpuwarden.toml"} <= names
    shipped = zipfile.ZipFile(wheel).read("gpuwarden/share/gpuwarden.toml").decode()
    assert shipped == (ROOT / "config/gpuwarden.toml").read_text()


def test_the_installed_wheel_runs_the_daemon_on_a_file_source(venv, tmp_path):
    gw = str(venv / "bin/gpuwarden")
    port, log = free_port(), tmp_path / "kern.log"
    log.touch()
    config = tmp_path / "gw.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[exporter]\nport = {port}\n'
                      f'[cache]\ndirs = ["{tmp_path / "cache"}"]\n[kernel]\nsource = "file"\nfile = "{log}"\n')
    check = subprocess.run([gw, "check", str(config), "--json"], capture_output=True, text=True, timeout=60,
                           cwd=tmp_path)
    assert check.returncode == 0 and json.loads(check.stdout)["valid"] is True, check.stderr

    stderr = (tmp_path / "stderr.log").open("wb")
    daemon = subprocess.Popen([gw, "--config", str(config), "run"], stdout=subprocess.DEVNULL, stderr=stderr,
                              cwd=tmp_path)
    try:
        def serving():
            assert daemon.poll() is None, (tmp_path / "stderr.log").read_text()
            return "gpuwarden running" in (tmp_path / "stderr.log").read_text()
        wait_for(serving, 30, what="the installed daemon to run")
        metrics = http_get(f"http://127.0.0.1:{port}/metrics")
        assert "gpuwarden_build_info{" in metrics and 'gpuwarden_source_up{source="kernel"} 1.0' in metrics, metrics
        with log.open("a") as out:
            out.write(XID)

        def stored():
            out = subprocess.run([gw, "--config", str(config), "events", "--json"], capture_output=True, text=True,
                                 timeout=60, cwd=tmp_path)
            return [e for e in json.loads(out.stdout) if e["kind"] == "xid"]
        event = wait_for(stored, 20, interval=0.5, what="the Xid stored by the installed daemon")[0]
        assert (event["gpu"], event["evidence"]["xid"]) == ("ffff:fe:1f.0", 79)
    finally:
        daemon.send_signal(signal.SIGTERM)
        rc = daemon.wait(15)
        stderr.close()
    assert rc == 0, (tmp_path / "stderr.log").read_text()


def test_the_installed_gpuwarden_places_a_unit_that_starts_itself(venv, tmp_path):
    done = subprocess.run([str(venv / "bin/gpuwarden"), "install", "--root", str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    unit = (tmp_path / "etc/systemd/system/gpuwarden.service").read_text()
    assert f"ExecStart={venv / 'bin/gpuwarden'} run\n" in unit
