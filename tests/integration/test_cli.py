"""`gpuwarden replay` and `gpuwarden events` as a user runs them."""

import json
import os
import shlex
import signal
import subprocess
import time
from datetime import datetime

import pytest
from helpers import GPUWARDEN, free_port, need, wait_for

from gpuwarden.core.model import Event, Severity
from gpuwarden.store.sqlite import Store


def run(*args, stdin=None):
    return subprocess.run([*GPUWARDEN, *args], capture_output=True, text=True, input=stdin, timeout=60)


def test_replay_json_over_a_corpus_file(corpus):
    log = corpus / "kernel/027-nv-xid-79-fallen-off-bus-journal-rc-all-channels.log"
    result = run("replay", "--jsonl", str(log))
    assert result.returncode == 3, result.stderr  # it found a critical event
    events = [json.loads(line) for line in result.stdout.splitlines()]
    xid = next(e for e in events if e["kind"] == "xid")
    assert (xid["xid"], xid["severity"], xid["gpu"], xid["count"]) == (79, "critical", "0000:01:00.0", 1)
    assert "fallen off the bus" in xid["line"]
    lost = next(e for e in events if e["kind"] == "device_lost")
    assert lost["xid"] is None


def test_replay_reads_stdin_and_counts_malformed_lines():
    text = '{"MESSAGE": "broken\n[5.0] amdgpu 0000:03:00.0: amdgpu: GPU Recovery Failed: -19\n'
    result = run("replay", "--jsonl", "-", stdin=text)
    assert result.returncode == 3  # a failed reset is critical
    [event] = [json.loads(line) for line in result.stdout.splitlines()]
    assert (event["kind"], event["gpu"]) == ("reset_failed", "0000:03:00.0")
    assert "1 malformed line skipped" in result.stderr


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
    assert result.returncode == 0 and "no events since " in result.stderr
    assert run("--config", str(cfg), "events", "--since", "soon").returncode == 2


def test_events_without_a_store_say_so_and_create_nothing(tmp_path):
    """A new user asks before the daemon ever ran (or as another user, whose default state_dir differs)."""
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}/state"\n')
    result = run("events", "--config", str(cfg))
    assert result.returncode == 0 and result.stdout == ""
    assert f"no store at {tmp_path}/state/gpuwarden.db: gpuwarden has not run with this state_dir" in result.stderr
    assert run("events", "--config", str(cfg), "--json").stdout == "[]\n"  # still one JSON document
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
    events = [json.loads(line) for line in run("--config", str(cfg), "events", "--jsonl").stdout.splitlines()]
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


# --- the conventions: one JSON form per family, a closed pipe, --since, filters, exit codes --------------------


def test_check_json_is_nothing_but_json_through_jq(tmp_path):
    jq = need("jq", "jq")
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n[[engine]]\nname = "e"\n'
                   'metrics_url = "http://127.0.0.1:9/metrics"\n')
    out = subprocess.run(f"set -o pipefail; {' '.join(GPUWARDEN)} check {cfg} --json | {jq} -c .", shell=True,
                         executable="/bin/bash", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    assert document["file"] == str(cfg) and document["valid"] is True
    assert document["config"]["daemon"]["state_dir"] == str(tmp_path)
    assert document["kill_would_take"]["e"] == {"processes": [], "refused": []}


def test_a_closed_pipe_ends_replay_quietly(tmp_path):
    big = tmp_path / "big.log"  # far more than a pipe holds: the writer is still writing when head leaves
    big.write_text("".join(f"[{i}.0] amdgpu {i // 256:04x}:{i % 256:02x}:00.0: amdgpu: GPU Recovery Failed: -19\n"
                           for i in range(6000)))
    out = subprocess.run(f"{' '.join(GPUWARDEN)} replay {big} | head -1; echo \"rc=${{PIPESTATUS[0]}}\"",
                         shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=120)
    assert out.stdout.count("reset_failed") == 1 and "rc=141" in out.stdout, out.stdout
    assert out.stderr == "", out.stderr  # no BrokenPipeError, no traceback


def test_replay_exit_code_says_whether_it_found_something_critical(corpus):
    assert run("replay", str(corpus / "kernel/001-amd-sq-intr-wave-errors.log")).returncode == 0  # warnings only
    found = run("replay", "--json", str(corpus / "kernel/027-nv-xid-79-fallen-off-bus-journal-rc-all-channels.log"))
    assert found.returncode == 3
    assert any(e["kind"] == "xid" for e in json.loads(found.stdout))  # one document


@pytest.fixture
def store_cfg(tmp_path):
    now = time.time()
    store = Store(tmp_path / "gpuwarden.db")
    store.add_events([
        Event("xid", Severity.CRITICAL, "Xid 79", now - 7200, gpu="0000:01:00.0"),
        Event("sq_intr", Severity.WARNING, "wave", now - 600, gpu="0000:03:00.0"),
        Event("engine_stall", Severity.CRITICAL, "stalled", now - 60, engine="vllm", gpu="0000:03:00.0"),
        Event("engine_exited", Severity.WARNING, "gone", now - 30, engine="sglang"),
        Event("gpu_power_spike", Severity.INFO, "spike", now - 10, gpu="0000:01:00.0"),
    ])
    store.close()
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n')
    return cfg


def kinds(cfg, *args):
    result = run("--config", str(cfg), "events", "--json", *args)
    assert result.returncode == 0, result.stderr
    return [e["kind"] for e in json.loads(result.stdout)]


def test_events_say_which_are_history_and_when_their_line_was_logged(tmp_path):
    """A new user's `events` after a first start showed old faults stamped with the daemon's start, as if new."""
    now = time.time()
    store = Store(tmp_path / "gpuwarden.db")
    store.add_events([
        Event("xid", Severity.WARNING, "Xid 13", now - 5, gpu="ffff:fe:1f.7").as_history(now - 3600),
        Event("sq_intr", Severity.WARNING, "wave", now - 5, gpu="ffff:fe:1f.7").as_history(),
        Event("ring_timeout", Severity.WARNING, "ring", now - 4, gpu="ffff:fe:1f.7"),
    ])
    store.close()
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n')
    lines = run("--config", str(cfg), "events").stdout.splitlines()
    logged = datetime.fromtimestamp(now - 3600).isoformat(sep=" ", timespec="seconds")
    assert lines[0].endswith(f"Xid 13 [history: logged {logged}]"), lines
    assert lines[1].endswith("wave [history: logged before gpuwarden started]"), lines
    assert lines[2].endswith(" ring"), lines


def test_events_filters(store_cfg):
    assert kinds(store_cfg) == ["xid", "sq_intr", "engine_stall", "engine_exited", "gpu_power_spike"]
    assert kinds(store_cfg, "--kind", "xid", "--kind", "sq_intr") == ["xid", "sq_intr"]
    assert kinds(store_cfg, "--gpu", "0000:03:00.0") == ["sq_intr", "engine_stall"]
    assert kinds(store_cfg, "--engine", "vllm", "--engine", "sglang") == ["engine_stall", "engine_exited"]
    assert kinds(store_cfg, "--severity", "warning") == ["xid", "sq_intr", "engine_stall", "engine_exited"]
    assert kinds(store_cfg, "--severity", "critical", "--gpu", "0000:03:00.0") == ["engine_stall"]
    lines = run("--config", str(store_cfg), "events", "--jsonl", "--kind", "xid").stdout.splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["xid"]


def test_events_limit_says_how_many_it_left_out_and_filters_before_it(store_cfg):
    """The newest --limit events are shown and the rest counted aloud (it printed the newest 1,000 silently); a
    filter picks among all the window's events, not among the newest 1,000 (an old xid was lost behind them)."""
    shown = run("--config", str(store_cfg), "events", "--json", "--limit", "2")
    assert [e["kind"] for e in json.loads(shown.stdout)] == ["engine_exited", "gpu_power_spike"]
    assert "3 older events left out" in shown.stderr
    assert kinds(store_cfg, "--limit", "1", "--kind", "xid") == ["xid"]
    whole = run("--config", str(store_cfg), "events", "--limit", "5")
    assert "left out" not in whole.stderr
    assert run("--config", str(store_cfg), "events", "--limit", "0").returncode == 2


def test_events_since_takes_durations_and_times(store_cfg):
    assert kinds(store_cfg, "--since", "15m") == ["sq_intr", "engine_stall", "engine_exited", "gpu_power_spike"]
    assert kinds(store_cfg, "--since", "90s") == ["engine_stall", "engine_exited", "gpu_power_spike"]
    local = datetime.fromtimestamp(time.time() - 45).isoformat(sep=" ", timespec="seconds")
    assert kinds(store_cfg, "--since", local) == ["engine_exited", "gpu_power_spike"]
    utc = datetime.fromtimestamp(time.time() - 3600).astimezone().isoformat()  # with its zone
    assert kinds(store_cfg, "--since", utc)[0] == "sq_intr"
    bad = run("--config", str(store_cfg), "events", "--since", "yesterday-ish")
    assert bad.returncode == 2 and "neither a duration" in bad.stderr


def test_run_log_level_outlives_a_reload_found_without_pid(tmp_path):
    state = tmp_path / "state"
    cfg = tmp_path / "gw.toml"
    log = tmp_path / "kern.log"
    log.touch()
    cfg.write_text(f'[daemon]\nstate_dir = "{state}"\nlog_level = "debug"\n[exporter]\nenabled = false\n'
                   f'[kernel]\nsource = "file"\nfile = "{log}"\n')
    with open(tmp_path / "stderr", "wb") as err:
        daemon = subprocess.Popen([*GPUWARDEN, "--config", str(cfg), "run", "--log-level", "warning"],
                                  stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for(lambda: (state / "gpuwarden.db").exists(), 20, what="the daemon's store")
        reload = run("--config", str(cfg), "reload", "--timeout", "30")  # no --pid: it finds the daemon
        assert reload.returncode == 0 and "reloaded" in reload.stdout, reload.stderr
        (tmp_path / "other.toml").write_text(f'[daemon]\nstate_dir = "{tmp_path / "elsewhere"}"\n')
        other = run("--config", str(tmp_path / "other.toml"), "reload")
        assert other.returncode == 1 and "no gpuwarden daemon" in other.stderr
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(15) == 0
    logged = (tmp_path / "stderr").read_text()
    assert " INFO " not in logged and " DEBUG " not in logged, logged  # --log-level, not the file's debug


JSON_COMMANDS = [("check", "--json"), ("events", "--json"), ("incidents", "--json"), ("conditions", "--json"),
                 ("doctor", "--json"), ("guard", "status", "--json"), ("status", "--json", "--timeout", "1"),
                 ("probe", "http://127.0.0.1:9/metrics", "--json", "--timeout", "1"), ("replay", "--json", "-")]


@pytest.mark.parametrize("command", JSON_COMMANDS, ids=lambda c: c[0])
def test_every_json_command_prints_one_json_document_and_nothing_else(tmp_path, command):
    """With --json, standard output is exactly one JSON document, whatever the command has to say besides
    (no store, no daemon, no GPU, an engine that does not answer): that goes to standard error."""
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n[exporter]\nport = {free_port()}\n')
    out = run("--config", str(cfg), *command, stdin="")
    assert out.returncode in (0, 1), out.stderr  # probe: 1, nothing answers
    json.loads(out.stdout)  # one document: a second one, or any text, would not parse


@pytest.mark.parametrize("command", ["events", "incidents", "conditions", "replay"])
def test_jsonl_commands_print_one_object_a_line(store_cfg, corpus, command):
    extra = [str(corpus / "kernel/027-nv-xid-79-fallen-off-bus-journal-rc-all-channels.log")] if command == "replay" \
        else []
    out = run("--config", str(store_cfg), command, "--jsonl", *extra)
    assert out.returncode in (0, 3), out.stderr  # replay: 3, it found something critical
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert all(isinstance(row, dict) for row in rows)
    assert rows or command in ("incidents", "conditions")  # the store holds events, no incident or condition


# --- the man page and the bash completion, both from the argparse tree ---------------------------------------

def _complete(*words: str) -> list[str]:
    """What bash's completion offers for the last word: the function `complete -p` names, run as readline would
    (COMP_WORDS, COMP_CWORD), on the script `gpuwarden completion bash` prints."""
    script = ("source <(\"$@\" completion bash) && spec=$(complete -p gpuwarden) && echo \"$spec\" && "
              "fn=$(sed -n 's/.* -F \\([^ ]*\\) .*/\\1/p' <<<\"$spec\") && "
              f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)}) && COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)) && "
              "COMP_LINE=\"${COMP_WORDS[*]}\" && COMP_POINT=${#COMP_LINE} && "
              "\"$fn\" && printf '%s\\n' \"${COMPREPLY[@]}\"")
    out = subprocess.run(["bash", "-c", script, "bash", *GPUWARDEN], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    spec, *offered = out.stdout.splitlines()
    assert spec.startswith("complete ") and spec.endswith(" gpuwarden"), spec
    return [w for w in offered if w]


def test_bash_completion_completes_commands_options_and_choices():
    assert _complete("gpuwarden", "ev") == ["events"]
    assert set(_complete("gpuwarden", "events", "--s")) == {"--since", "--severity"}
    assert _complete("gpuwarden", "events", "--severity", "c") == ["critical"]
    assert _complete("gpuwarden", "run", "--log-level", "") == ["debug", "info", "warning", "error"]
    assert _complete("gpuwarden", "completion", "") == ["bash"]
    assert _complete("gpuwarden", "--config", "") == []  # a value: bash's own (file) completion takes over


def test_the_man_page_is_every_command_and_option_and_man_renders_it(tmp_path):
    page = run("man")
    assert page.returncode == 0 and page.stdout.startswith(".TH GPUWARDEN 1"), page.stderr
    man = need("man", "man-db")
    (tmp_path / "gpuwarden.1").write_text(page.stdout)
    shown = subprocess.run([man, "-l", str(tmp_path / "gpuwarden.1")], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "MANWIDTH": "200", "MAN_KEEP_FORMATTING": ""})
    assert shown.returncode == 0 and "troff:" not in shown.stderr, shown.stderr
    text = shown.stdout
    for command in ("run", "reload", "check", "events", "replay", "status", "install", "man", "completion"):
        assert f"\n   {command}\n" in text, command
    for option in ("--log-level", "--since", "--severity", "--jsonl", "--root", "--exec"):
        assert option in text, option
