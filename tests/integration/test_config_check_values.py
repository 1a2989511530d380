"""Issue 24, finding 10: `check` passed values that break `run` or silently do nothing, refused "30" (which is
seconds), and lost the file:line: form of a TOML syntax error."""

import subprocess

import pytest
from helpers import GPUWARDEN

ENGINE = '[[engine]]\nname = "e"\nmetrics_url = "http://127.0.0.1:1/metrics"\n'


def check(tmp_path, text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "gw.toml"
    path.write_text(text)
    return subprocess.run([*GPUWARDEN, "check", str(path), "--show"], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("config", "names"), [
    ('[alerts]\n[[alerts.target]]\nurl = "json://127.0.0.1:1/x"\ntags = ["engine_stall", "devce_lost"]\n',
     ":4: alerts.target[0].tags[1]: unknown tag 'devce_lost' (did you mean 'device_lost'?)"),
    (ENGINE + "scrape_timeout = 5000\n",
     ':4: engine[0].scrape_timeout: must be at most 300s (durations are seconds: write "5000ms" for milliseconds)'),
    (ENGINE + 'min_stall = "100ms"\n', ":4: engine[0].min_stall: must be at least 1s"),
    ('[gpu]\njunction_warn_celsius = 115\njunction_critical_celsius = 110\n',
     ":2: gpu.junction_warn_celsius: junction_warn_celsius (115) is above junction_critical_celsius (110)"),
    (ENGINE + 'scrape_interval = "2s"\nscrape_timeout = "10s"\n',
     ":5: engine[0].scrape_timeout: scrape_timeout (10s) is above scrape_interval (2s)"),
    ('[daemon]\nstate_dir = "{file}"\n', ":2: daemon.state_dir: {file} is not a folder"),
    ('[daemon]\nlog_level = "info"\nstatus_interval = \n', ":3: not valid TOML: Invalid value"),
    ('[alerts]\n\n[[alerts.target]]\nname = "am"\nurl = "alertmanager://am.example.org:http"\n',
     ":5: alerts.target[0].url: port 'http' is not a port number (am)"),
    ('[alerts]\nurls = ["alertmanager:///api"]\n',
     ":2: alerts.urls[0]: an Alertmanager URL needs a host: alertmanager://host:9093 (1:alertmanager)"),
], ids=["route-tag-misspelt", "scrape_timeout-5000", "min_stall-100ms", "warn-above-critical",
        "timeout-above-interval", "state_dir-a-file", "toml-syntax", "alertmanager-port", "alertmanager-host"])
def test_check_refuses_naming_key_and_line(tmp_path, config, names):
    file = tmp_path / "a-file"
    file.write_text("")
    result = check(tmp_path, config.format(file=file))
    assert result.returncode == 78, result.stdout + result.stderr
    assert f"{tmp_path / 'gw.toml'}{names.format(file=file)}" in result.stderr, result.stderr


def test_thirty_in_quotes_is_thirty_seconds(tmp_path):
    result = check(tmp_path, ENGINE + 'min_stall = "30"\nkill_grace = "5"\n')
    assert result.returncode == 0, result.stderr
    assert '"min_stall": 30.0' in result.stdout and '"kill_grace": 5.0' in result.stdout


def test_a_file_kernel_source_is_said_to_be_forgeable(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("")
    result = check(tmp_path, f'[kernel]\nsource = "file"\nfile = "{log}"\n')
    assert result.returncode == 0, result.stderr
    assert "cannot tell a kernel line from one any user writes with `logger -t kernel`" in result.stderr
