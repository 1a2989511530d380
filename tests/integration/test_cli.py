"""`gpuwarden replay` and `gpuwarden events` as a user runs them."""

import json
import subprocess

import pytest
from helpers import GPUWARDEN

from gpuwarden.store import Store


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
    Store(tmp_path / "gpuwarden.db").close()  # as a daemon that recorded nothing leaves it
    result = run("--config", str(cfg), "events", "--since", "1h")
    assert result.returncode == 0 and "no events since 1h ago" in result.stderr
    assert run("--config", str(cfg), "events", "--since", "soon").returncode == 2


def test_events_without_a_store_say_so_and_create_nothing(tmp_path):
    """A new user asks before the daemon ever ran (or as another user, whose default state_dir differs)."""
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}/state"\n')
    result = run("events", "--config", str(cfg))
    assert result.returncode == 0 and result.stdout == ""
    assert f"no store at {tmp_path}/state/gpuwarden.db: gpuwarden has not run with this state_dir" in result.stderr
    assert not (tmp_path / "state").exists()


def test_quarantine_moves_the_poisoned_caches_and_records_it(tmp_path):
    caches = [tmp_path / "vllm", tmp_path / "triton", tmp_path / "clean"]
    for cache in caches:
        (cache / "sub").mkdir(parents=True)
        (cache / "sub" / "done.bin").write_bytes(b"compiled")
    (caches[0] / "sub" / "cut.py").touch()
    (caches[1] / "cut.hsaco").touch()
    cfg = tmp_path / "gw.toml"
    dirs = json.dumps([str(c) for c in caches])
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}/state"\n[cache]\ndirs = {dirs}\n')
    dry = run("--config", str(cfg), "quarantine", "--dry-run")
    assert dry.returncode == 0 and "would move" in dry.stdout and all(c.exists() for c in caches)
    result = run("--config", str(cfg), "quarantine", "--reason", "power cut")
    assert result.returncode == 0, result.stderr
    assert not caches[0].exists() and not caches[1].exists() and caches[2].exists()
    [vllm] = tmp_path.glob("vllm.BROKEN-*-power-cut")
    assert sorted(p.name for p in (vllm / "sub").iterdir()) == ["cut.py", "done.bin"]
    events = [json.loads(line) for line in run("--config", str(cfg), "events", "--json").stdout.splitlines()]
    moved = [e for e in events if e["kind"] == "cache_poisoned" and not e["evidence"]["dry_run"]]
    assert [m["zero_byte_files"] for m in moved[0]["evidence"]["moved"]] == [1, 1]
    again = run("--config", str(cfg), "quarantine")
    assert again.returncode == 0 and "nothing moved" in again.stdout
    named = run("--config", str(cfg), "quarantine", str(caches[2]))  # a named directory moves as asked
    assert named.returncode == 0 and not caches[2].exists() and "0 zero-byte" in named.stdout


@pytest.mark.parametrize("command", [["npd-check"], ["probe", "http://127.0.0.1:9/metrics"], ["reload", "--pid", "1"]])
@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf", "soon"])
def test_a_timeout_that_cannot_be_waited_is_a_usage_error(command, timeout):
    result = subprocess.run([*GPUWARDEN, *command, "--timeout", timeout], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "is not a number of seconds above 0" in result.stderr, result.stderr
