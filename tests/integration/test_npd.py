"""`gpuwarden npd-check` against the state of a real daemon: the store it wrote, its exporter, its absence."""

import json
import sqlite3
import subprocess
from pathlib import Path

from helpers import GPUWARDEN, TEST_GPU, wait_for

from gpuwarden.cli import npd
from gpuwarden.config.settings import parse_duration

NPD_CONFIG = Path(__file__).resolve().parents[2] / "config/npd/gpuwarden-plugin-monitor.json"

LOST = f"Dec 03 10:00:00 host kernel: amdgpu {TEST_GPU}: amdgpu: device lost from bus!\n"
TIMEOUT = "--timeout=3"


def npd_check(config, condition: str) -> tuple[int, str]:
    """The exit status and stdout, as NPD reads them; stdout must be one line of at most 80 bytes."""
    result = subprocess.run([*GPUWARDEN, "--config", str(config), "npd-check", "--condition", condition, TIMEOUT],
                            capture_output=True, text=True, timeout=15)  # the command bounds itself below this
    assert result.stdout.endswith("\n") and result.stdout.count("\n") == 1, result
    assert len(result.stdout.rstrip("\n").encode()) <= 80, result.stdout
    return result.returncode, result.stdout.strip()


def shipped_rules(config) -> list[tuple[str, int, str]]:
    """Each rule of the shipped NPD config run as NPD runs it (its args, its timeout), against `config`:
    (condition, exit status, stdout cut to max_output_length)."""
    npd = json.loads(NPD_CONFIG.read_text())
    cut = npd["pluginConfig"]["max_output_length"]
    out = []
    for rule in npd["rules"]:
        result = subprocess.run([*GPUWARDEN, *rule["args"], "--config", str(config)], capture_output=True, text=True,
                                timeout=parse_duration(rule["timeout"]))
        out.append((rule["condition"], result.returncode, result.stdout.strip()[:cut]))
    return out


def test_the_npd_config_is_what_npd_accepts():
    """NPD's own checks of a custom plugin config (pkg/custompluginmonitor/types/config.go, Validate)."""
    npd = json.loads(NPD_CONFIG.read_text())
    assert npd["plugin"] == "custom" and npd["source"]
    timeout = parse_duration(npd["pluginConfig"]["timeout"])
    assert timeout <= 5 and npd["pluginConfig"]["max_output_length"] == 80
    defaults = {c["type"]: c for c in npd["conditions"]}
    for rule in npd["rules"]:
        assert rule["type"] == "permanent" and rule["condition"] in defaults  # a permanent rule needs a default
        assert parse_duration(rule["timeout"]) <= timeout
        assert float(rule["args"][rule["args"].index("--timeout") + 1]) < parse_duration(rule["timeout"])
        assert rule["path"] == "/opt/gpuwarden/bin/gpuwarden"  # where `make install` puts it
    assert {r["args"][r["args"].index("--condition") + 1] for r in npd["rules"]} == {"gpu", "engine", "daemon"}


def engine(e, name, on_stall) -> str:
    return (f'[[engine]]\nname = "{name}"\nmetrics_url = "{e.url}"\nscrape_interval = "0.5s"\nmin_stall = "2s"\n'
            f'kill_grace = "1s"\non_stall = "{on_stall}"\n')


def test_npd_check_reports_gpu_engine_and_daemon_from_a_real_daemon(daemon_factory, fake_engine):
    fixed, stuck = fake_engine("progress"), fake_engine("progress")
    d = daemon_factory(engine(fixed, "fixed", "kill") + engine(stuck, "stuck", "alert")).start()
    d.wait_serving()
    cfg = d.config_path
    assert npd_check(cfg, "gpu")[0] == 0 and npd_check(cfg, "gpu")[1].startswith("no GPU lost since boot")
    assert npd_check(cfg, "engine") == (0, "no engine problem left unfixed")
    assert npd_check(cfg, "daemon") == (0, "gpuwarden runs, every component up")
    defaults = {c["type"]: c["message"] for c in json.loads(NPD_CONFIG.read_text())["conditions"]}
    for condition, code, text in shipped_rules(cfg):
        assert code == 0 and text.startswith(defaults[condition]), (condition, code, text)

    def event(kind, name=None):
        return wait_for(lambda: [e for e in d.events() if e["kind"] == kind and name in (None, e["engine"])],
                        30, interval=0.2, what=f"a {kind} event")

    fixed.set_mode("stall")
    event("engine_killed", "fixed")
    # killed (on_stall = "kill"), and nothing of gpuwarden's starts it again: down, and NPD hears it (issue 36)
    code, text = npd_check(cfg, "engine")
    assert code == 1 and text.startswith("engine fixed: engine_down at ") and text.endswith(", not restarted"), text
    stuck.set_mode("stall")
    event("engine_stall", "stuck")
    code, text = npd_check(cfg, "engine")
    assert code == 1 and text.startswith("engine stuck: engine_stalled at "), text
    assert text.endswith(", not fixed (+1 more)"), text  # and the killed one, down

    with d.log_file.open("a") as log:
        log.write(LOST)
    event("device_lost")
    code, text = npd_check(cfg, "gpu")
    assert code == 1 and text.startswith(f"device_lost {TEST_GPU} at ") and text.endswith(": reboot"), text

    # Another process holds the store: the daemon cannot write (a problem), the WAL store is still read.
    db = d.state / "gpuwarden.db"
    lock = sqlite3.connect(db, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    with d.log_file.open("a") as log:
        log.write(LOST.replace("10:00:00", "10:00:09"))
    wait_for(lambda: "gpuwarden_store_writable 0.0" in d.metrics(), 20, what="the store to be unwritable")
    assert npd_check(cfg, "daemon") == (1, "gpuwarden cannot write its event store")
    assert npd_check(cfg, "gpu")[0] == 1
    lock.execute("ROLLBACK")
    lock.close()

    assert d.stop() == 0
    files = sorted(p.name for p in d.state.iterdir())
    assert "gpuwarden.db-shm" not in files  # the last connection closed: a reader cannot use shared memory
    code, text = npd_check(cfg, "daemon")
    assert code == 1 and text.startswith(f"gpuwarden is not running: no answer at 127.0.0.1:{d.port}"), text
    assert npd_check(cfg, "gpu")[0] == 1  # the stopped daemon's store, read-only
    assert sorted(p.name for p in d.state.iterdir()) == files  # nothing created, nothing changed
    assert [code for _, code, _ in shipped_rules(cfg)] == [1, 1, 1]

    # A store held exclusively (readers too): unknown, within the bound, never a hang or a guess.
    lock = sqlite3.connect(db, isolation_level=None)
    lock.execute("PRAGMA locking_mode=EXCLUSIVE")
    lock.execute("BEGIN EXCLUSIVE")
    code, text = npd_check(cfg, "gpu")
    assert (code, text) == (2, "unknown: store unreadable: database is locked"), text
    lock.close()


def test_npd_check_is_unknown_without_a_store_or_a_config(tmp_path):
    config = tmp_path / "gpuwarden.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[exporter]\nenabled = false\n')
    # cut at NPD's 80 bytes, as a long path is (pytest's own tmp paths are longer than 60)
    expected = npd.message(f"unknown: no store at {tmp_path / 'state' / 'gpuwarden.db'} (has gpuwarden run here?)")
    for condition in ("gpu", "engine"):
        assert npd_check(config, condition) == (2, expected)
    assert not (tmp_path / "state").exists()
    assert npd_check(config, "daemon") == (2, "unknown: [exporter] is disabled, so the daemon cannot be asked")
    config.write_text("[daemon]\nstatus_interval = 0\n")
    code, text = npd_check(config, "gpu")
    assert code == 2 and text.startswith("unknown: configuration error: "), text
