"""`gpuwarden replay` and `gpuwarden events` as a user runs them."""

import json
import subprocess

from helpers import GPUWARDEN


def run(*args, stdin=None):
    return subprocess.run([*GPUWARDEN, *args], capture_output=True, text=True, input=stdin, timeout=60)


def test_replay_json_over_a_corpus_file(corpus):
    log = corpus / "kernel/027-nv-xid-79-fallen-off-bus-journal-rc-all-channels.log"
    result = run("replay", "--format", "json", str(log))
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    xid = next(e for e in events if e["kind"] == "xid")
    assert (xid["xid"], xid["severity"], xid["gpu"], xid["count"]) == (79, "critical", "0000:01:00.0", 1)
    assert "fallen off the bus" in xid["line"]
    lost = next(e for e in events if e["kind"] == "device_lost")
    assert lost["xid"] is None


def test_replay_reads_stdin_and_counts_malformed_lines():
    text = '{"MESSAGE": "broken\n[5.0] amdgpu 0000:03:00.0: amdgpu: GPU Recovery Failed: -19\n'
    result = run("replay", "--format", "json", "-", stdin=text)
    assert result.returncode == 0
    [event] = [json.loads(line) for line in result.stdout.splitlines()]
    assert (event["kind"], event["gpu"]) == ("reset_failed", "0000:03:00.0")
    assert "1 malformed line(s) skipped" in result.stderr


def test_replay_table_and_missing_file(corpus, tmp_path):
    table = run("replay", str(corpus / "kernel/001-amd-sq-intr-wave-errors.log"))
    assert "sq_intr" in table.stdout and "x11" in table.stdout
    missing = run("replay", str(tmp_path / "nope.log"))
    assert missing.returncode == 1 and "No such file" in missing.stderr


def test_events_on_an_empty_store(tmp_path):
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n')
    result = run("--config", str(cfg), "events", "--since", "1h")
    assert result.returncode == 0 and "no events since 1h ago" in result.stderr
    assert run("--config", str(cfg), "events", "--since", "soon").returncode == 2
