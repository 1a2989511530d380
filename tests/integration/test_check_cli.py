"""Issue 39, `check` and the CLI as a new user meets them: `check` in the style of `nginx -t` and `promtool check`
(one line when valid, each error with its line, cause and fix, top to bottom), the mistakes it let through or
said badly, the time forms of `events`, `replay`'s exit status, `make run`, the man page, install and uninstall.
Each runs the real `gpuwarden` command (or `make`, `man`)."""

import os
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest
from helpers import GPUWARDEN, need

from fakesysfs import build
from gpuwarden.core.model import Event, Severity
from gpuwarden.store.sqlite import Store

ROOT = Path(__file__).resolve().parents[2]
ENGINE = '[[engine]]\nname = "e"\nmetrics_url = "http://127.0.0.1:1/metrics"\n'


def gw(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUWARDEN, *args], capture_output=True, text=True, input=stdin, timeout=60)


def check(tmp_path: Path, text: str | bytes, *extra: str) -> subprocess.CompletedProcess:
    path = tmp_path / "gw.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return gw("check", str(path), *extra)


def refused(tmp_path: Path, text: str) -> str:
    result = check(tmp_path, text)
    assert result.returncode == 78, result.stdout + result.stderr
    return result.stderr.removeprefix("gpuwarden: configuration error:\n").removeprefix(f"{tmp_path / 'gw.toml'}")


@pytest.mark.parametrize("config", ['[kernel]\nsource = "file"\nfile = "{dir}"\n',
                                    ENGINE + 'source = "log"\nlog_file = "{dir}"\n'], ids=["kernel.file", "log_file"])
def test_a_directory_is_refused_as_a_log_file(tmp_path, config):
    """`docker run -v /var/log/kern.log:…` where the host has no such file makes a directory of it: `run` then
    failed in a loop while `check` called it valid."""
    folder = tmp_path / "kern.log"
    folder.mkdir()
    said = refused(tmp_path, config.format(dir=folder))
    assert f"'{folder}' is a directory, not a log file" in said and "mount a file that exists" in said, said


def test_a_malformed_alert_url_is_told_why(tmp_path):
    """Apprise's refusal named no reason: `(1:)`, the target's name of a URL without a scheme."""
    said = refused(tmp_path, '[alerts]\nurls = ["ntfy.sh/my-topic"]\n')
    assert said.startswith(":2: alerts.urls[0]: not a URL: an alert URL starts with its service's scheme"), said
    assert "(1:)" not in said and "my-topic" not in said  # the URL is a secret: not repeated


@pytest.mark.parametrize(("config", "said"), [
    ('[alerts]\nurls = ["ntfys://ntfy.example.org:99999/box"]\n', ":2: alerts.urls[0]: port 99999 is not a port"),
    ('[alerts]\n[[alerts.target]]\nurl = "json://127.0.0.1:99999/hook"\n',
     ":3: alerts.target[0].url: port 99999 is not a port"),
    (ENGINE.replace(":1/", ":99999/"),
     ":3: engine[0].metrics_url: 'http://127.0.0.1:99999/metrics': Port out of range"),
    ("[exporter]\nport = 99999\n", ":2: exporter.port: Input should be less than or equal to 65535"),
], ids=["alert-url", "alert-target", "metrics_url", "exporter"])
def test_port_99999_is_refused_everywhere(tmp_path, config, said):
    assert said in refused(tmp_path, config)


def test_a_table_where_an_array_of_tables_is_meant_says_so(tmp_path):
    said = refused(tmp_path, ENGINE.replace("[[engine]]", "[engine]"))
    assert said.startswith(":1: engine: [engine] is one table, where [[engine]] (double brackets"), said
    assert "valid list" not in said


@pytest.mark.parametrize("word", ["yes", "true", "on", "1"])
def test_a_quoted_word_is_not_a_boolean(tmp_path, word):
    said = refused(tmp_path, f'[exporter]\nenabled = "{word}"\n')
    assert f":2: exporter.enabled: Input should be true or false, without quotes (TOML's booleans), not '{word}'" \
        in said


def test_the_log_level_in_capitals_is_taken(tmp_path):
    result = check(tmp_path, '[daemon]\nlog_level = "INFO"\n', "--json")
    assert result.returncode == 0, result.stderr
    assert '"log_level": "info"' in result.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon]\nbogus = 1\n")  # `run` stops at the file, after taking its options
    assert gw("run", "--log-level", "DEBUG", "--config", str(bad)).returncode == 78


@pytest.mark.parametrize("name", ["", "  ", " vllm", "a,b"])
def test_an_engine_name_that_cannot_name_it_is_refused(tmp_path, name):
    said = refused(tmp_path, ENGINE.replace('"e"', f'"{name}"'))
    assert said.startswith(":2: engine[0].name: "), said


def test_errors_come_in_the_files_order(tmp_path):
    said = refused(tmp_path, '[daemon]\nlog_level = "loud"\nbogus = 1\n[[engine]]\nname = ""\nmetrics_url = "x"\n'
                             '[exporter]\nenabled = "yes"\n')
    lines = [line.split(":")[1] for line in said.strip().splitlines()]
    assert lines == ["2", "3", "5", "6", "8"], said


def test_a_byte_order_mark_is_taken(tmp_path):
    result = check(tmp_path, "\ufeff[daemon]\nlog_level = \"debug\"\n".encode())
    assert result.returncode == 0, result.stderr


def test_a_valid_file_is_one_line_and_show_prints_no_null(tmp_path):
    result = check(tmp_path, ENGINE + '[alerts]\n[[alerts.target]]\nurl = "json://127.0.0.1:9/hook"\n')
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{tmp_path / 'gw.toml'}: valid (1 engine, 1 alert target, kernel source auto)\n"
    shown = check(tmp_path, ENGINE + '[alerts]\n[[alerts.target]]\nurl = "json://127.0.0.1:9/hook"\n', "--show")
    assert shown.returncode == 0 and "null" not in shown.stdout, shown.stdout
    assert '"name": "1:json://127.0.0.1:9"' in shown.stdout and '"enabled": true' in shown.stdout  # resolved
    assert "# engine e: a kill now would take" in shown.stdout


def test_a_configured_gpu_the_box_does_not_have_is_warned_of(tmp_path):
    """A fake sysfs (no Radeon is here) with one GPU: the engine's other address and the guard's are warned of,
    each at its line; the file stays valid."""
    sysfs = build(tmp_path / "sys", {"0000:03:00.0": "rdna3"})
    text = (f'[gpu]\nsysfs_root = "{sysfs}"\n' + ENGINE + 'gpus = ["0000:03:00.0", "ffff:fe:1f.7"]\n'
            '[guard]\ndevices = ["ffff:fe:1e.7"]\n')
    result = check(tmp_path, text)
    assert result.returncode == 0, result.stderr
    assert "1 engine, 0 alert targets, kernel source auto, 2 warnings)" in result.stdout
    warnings = result.stderr.splitlines()
    assert warnings[0].startswith(f"warning: {tmp_path / 'gw.toml'}:6: engine[0].gpus[1]: GPU ffff:fe:1f.7 is not "
                                  "on this box (this box has 0000:03:00.0)"), warnings
    assert warnings[1].startswith(f"warning: {tmp_path / 'gw.toml'}:8: guard.devices[0]: GPU ffff:fe:1e.7 is not "
                                  "on this box"), warnings
    assert len(warnings) == 2


def test_a_log_file_that_does_not_exist_is_warned_of(tmp_path):
    """Valid (a log may be created later), but nothing is read until it is: `check` said nothing of it."""
    result = check(tmp_path, f'[kernel]\nsource = "file"\nfile = "{tmp_path}/kern.log"\n' + ENGINE +
                   f'source = "log"\nlog_file = "{tmp_path}/vllm.log"\n')
    assert result.returncode == 0, result.stderr
    assert f":3: kernel.file: {tmp_path}/kern.log does not exist: no kernel line is read" in result.stderr
    assert f":8: engine[0].log_file: {tmp_path}/vllm.log does not exist: e's progress is not read" in result.stderr


@pytest.fixture
def store_cfg(tmp_path):
    now = time.time()
    store = Store(tmp_path / "gpuwarden.db")
    store.add_events([Event("xid", Severity.CRITICAL, "Xid 79", now - 5 * 86400, gpu="ffff:fe:1f.7"),
                      Event("sq_intr", Severity.WARNING, "wave", now - 2 * 86400, gpu="ffff:fe:1f.7"),
                      Event("engine_stall", Severity.CRITICAL, "stalled", now - 60, engine="vllm")])
    store.close()
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n')
    return cfg


def kinds(cfg: Path, *args: str) -> list[str]:
    import json

    result = gw("--config", str(cfg), "events", "--json", *args)
    assert result.returncode == 0, result.stderr
    return [e["kind"] for e in json.loads(result.stdout)]


def test_events_take_weeks_yesterday_and_until(store_cfg):
    assert kinds(store_cfg, "--since", "1w") == ["xid", "sq_intr", "engine_stall"]
    assert kinds(store_cfg, "--since", "1w", "--until", "1d") == ["xid", "sq_intr"]
    assert kinds(store_cfg, "--since", "3d", "--until", "1h") == ["sq_intr"]
    midnight = datetime.now().replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    expected = [k for k, ago in (("xid", 5 * 86400), ("sq_intr", 2 * 86400), ("engine_stall", 60))
                if time.time() - ago >= midnight - 86400]
    assert kinds(store_cfg, "--since", "yesterday") == expected
    assert kinds(store_cfg, "--until", "yesterday") == []  # the default since (24h) is after it
    assert gw("--config", str(store_cfg), "events", "--until", "someday").returncode == 2


def test_replay_found_critical_is_not_a_usage_error(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("[5.0] amdgpu 0000:03:00.0: amdgpu: GPU Recovery Failed: -19\n")
    found = gw("replay", str(log))
    assert found.returncode == 3, found.stderr
    assert gw("replay").returncode == 2  # a usage error: no file named
    assert gw("replay", "--bogus", str(log)).returncode == 2


def test_make_run_installs_the_runtime_without_the_test_tools(tmp_path):
    make = need("make", "make")
    planned = subprocess.run([make, "-n", "-C", str(ROOT), "run", f"VENV={tmp_path / 'venv'}"], capture_output=True,
                             text=True, timeout=60)
    assert planned.returncode == 0, planned.stderr
    installs = [line for line in planned.stdout.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert installs == [f"{tmp_path / 'venv'}/bin/pip install -q -e '.[journal]'"], planned.stdout


def test_the_man_page_has_examples_and_no_markdown(tmp_path):
    page = gw("man")
    assert page.returncode == 0 and "`" not in page.stdout
    (tmp_path / "gpuwarden.1").write_text(page.stdout)
    shown = subprocess.run([need("man", "man-db"), "-l", str(tmp_path / "gpuwarden.1")], capture_output=True,
                           text=True, timeout=60, env={**os.environ, "MANWIDTH": "200", "MAN_KEEP_FORMATTING": ""})
    assert shown.returncode == 0 and "troff:" not in shown.stderr, shown.stderr
    examples = shown.stdout.split("\nEXAMPLES\n")[1].split("\nFILES\n")[0]
    assert "gpuwarden check /etc/gpuwarden/gpuwarden.toml" in examples
    assert "gpuwarden events --since yesterday --severity warning" in examples
    assert "`" not in shown.stdout


def test_install_says_the_next_step_and_uninstall_undoes_it(tmp_path):
    stage = tmp_path / "stage"
    done = gw("install", "--root", str(stage), "--exec", "/opt/gpuwarden/bin/gpuwarden")
    assert done.returncode == 0, done.stderr
    assert "gpuwarden check && gpuwarden test-alert" in done.stdout
    assert "systemctl daemon-reload && systemctl enable --now gpuwarden" in done.stdout
    (stage / "etc/gpuwarden/gpuwarden.toml").write_text("# mine\n")
    undone = gw("uninstall", "--root", str(stage))
    assert undone.returncode == 0, undone.stderr
    left = sorted(str(p.relative_to(stage)) for p in stage.rglob("*") if p.is_file())
    assert left == ["etc/gpuwarden/gpuwarden.toml"] and (stage / "etc/gpuwarden/gpuwarden.toml").read_text() == \
        "# mine\n"
    assert undone.stdout.count("removed ") == 4 and "kept " in undone.stdout  # unit, man page, completion, link
    assert not os.path.lexists(stage / "usr/local/bin/gpuwarden")
    again = gw("uninstall", "--root", str(stage))
    assert again.returncode == 0 and "nothing to remove" in again.stdout
