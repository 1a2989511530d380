"""Findings 1-3 of issue 13 and the discovered-engine default: a local user tries to make root's gpuwarden kill
what is not theirs. The user is real (gwattacker), its engine is a real process serving a /metrics that it makes
report a stall, and every would-be victim is a root process this test started (never a real service; PID 1
only in dry runs)."""

import os
import subprocess
import sys
import time

import pytest
from helpers import GPUWARDEN, free_port, wait_for

pytestmark = pytest.mark.root

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def engine_config(url: str, target: str = "", name: str = "victim", **settings) -> str:
    opts = {"scrape_interval": '"0.5s"', "min_stall": '"2s"', "kill_grace": '"1s"', **settings}
    return (f'[[engine]]\nname = "{name}"\nmetrics_url = "{url}"\n' + "".join(f"{k} = {v}\n" for k, v in opts.items())
            + (f"[engine.target]\n{target}\n" if target else ""))


def events_of(d, kind):
    return [e for e in d.events() if e["kind"] == kind]


def wait_event(d, kind, timeout=20, interval=0.2):
    return wait_for(lambda: next(iter(events_of(d, kind)), None), timeout, interval, what=f"a {kind} event")


def stalled(d, engine) -> dict:
    """Start the daemon, let the engine work, then stall it; the engine_stall event."""
    d.start()
    d.wait_serving()
    time.sleep(1.5)
    engine.set_mode("stall")
    return wait_event(d, "engine_stall")


def test_a_pidfile_the_user_can_write_names_no_victim(attacker, daemon_factory, root_process):
    """Finding 1: the user writes a root process's pid into a pidfile it owns; before, root killed it."""
    victim = root_process(*SLEEPER)
    engine = attacker.start_engine()
    pidfile = attacker.write(attacker.home / "engine.pid", f"{victim.pid}\n")
    d = daemon_factory(engine_config(engine.url, f'kind = "pidfile"\npidfile = "{pidfile}"'))
    stalled(d, engine)
    refused = wait_event(d, "kill_refused")
    assert f"pidfile {pidfile}" in refused["message"] and "not root" in refused["message"]
    time.sleep(2)
    assert victim.poll() is None and not events_of(d, "engine_killed")
    assert d.stop() == 0


def test_a_pidfile_naming_pid_1_takes_nothing_even_in_a_dry_run(attacker, daemon_factory, tmp_path):
    """Finding 1 as the issue saw it: `1` in the pidfile; before, the dry run listed every userspace process.
    The pidfile is root's here (only the contents are wrong): PID 1 itself is refused."""
    engine = attacker.start_engine()
    pidfile = tmp_path / "engine.pid"
    pidfile.write_text("1\n")
    d = daemon_factory(engine_config(engine.url, f'kind = "pidfile"\npidfile = "{pidfile}"', dry_run="true"))
    stalled(d, engine)
    refused = wait_event(d, "kill_refused")
    assert "PID 1" in refused["message"] and refused["evidence"]["refused"][0].startswith("1 root ")
    time.sleep(1)
    assert not events_of(d, "engine_killed")
    assert d.stop() == 0


def test_a_root_pidfile_naming_a_root_process_is_refused_for_a_users_engine(attacker, daemon_factory, tmp_path,
                                                                           root_process):
    """Finding 1, second half: even a root-owned pidfile may only name a process of the engine's user (the owner
    of the socket whose /metrics reported the stall), and its children are never reached."""
    victim = root_process(sys.executable, "-c", "import subprocess, sys, time\n"
                          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\ntime.sleep(600)")
    wait_for(lambda: len(subprocess.run(["pgrep", "-P", str(victim.pid)], capture_output=True).stdout.split()),
             10, what="the root victim's child")
    [child] = [int(x) for x in subprocess.run(["pgrep", "-P", str(victim.pid)], capture_output=True).stdout.split()]
    engine = attacker.start_engine()
    pidfile = tmp_path / "engine.pid"
    pidfile.write_text(f"{victim.pid}\n")
    d = daemon_factory(engine_config(engine.url, f'kind = "pidfile"\npidfile = "{pidfile}"'))
    stalled(d, engine)
    refused = wait_event(d, "kill_refused")
    assert f"another user than the engine's ({attacker.name})" in refused["message"]
    time.sleep(2)
    assert victim.poll() is None and os.path.exists(f"/proc/{child}") and not events_of(d, "engine_killed")
    assert d.stop() == 0


def test_a_root_pidfile_naming_the_users_engine_still_kills_it(attacker, daemon_factory, tmp_path):
    """The legitimate use: a root-owned pidfile with the engine's pid."""
    engine = attacker.start_engine("progress", "--orphans")
    pidfile = tmp_path / "engine.pid"
    pidfile.write_text(f"{engine.pids()[0]}\n")
    d = daemon_factory(engine_config(engine.url, f'kind = "pidfile"\npidfile = "{pidfile}"'))
    stalled(d, engine)
    killed = wait_event(d, "engine_killed")
    assert "killed victim: 3 processes" in killed["message"]
    wait_for(lambda: not engine.alive(), 10, what="the engine's tree to be gone")
    assert d.stop() == 0


def test_a_port_target_takes_only_the_socket_that_serves_the_url(attacker, daemon_factory, root_process):
    """Finding 2: the user's engine on 127.0.0.1:P, a root http.server on 127.0.0.2:P; before, both died."""
    port = free_port()
    bystander = root_process(sys.executable, "-m", "http.server", "--bind", "127.0.0.2", str(port))
    wait_for(lambda: subprocess.run(["ss", "-Htln", f"src 127.0.0.2:{port}"], capture_output=True,
                                    text=True).stdout.strip(), 10, what="the root http.server")
    engine = attacker.start_engine(port=port)
    d = daemon_factory(engine_config(engine.url))
    stalled(d, engine)
    killed = wait_event(d, "engine_killed")
    assert "killed victim: 2 processes" in killed["message"]
    wait_for(lambda: not engine.alive(), 10, what="the engine's tree to be gone")
    assert bystander.poll() is None
    assert d.stop() == 0


@pytest.fixture
def tmux_server(attacker):
    """A tmux server of the attacker, on its own socket, whose argv and window carry the pattern's text."""
    sock = f"gwtest-{os.getpid()}"
    attacker.run("tmux", "-L", sock, "new-session", "-d", "-s", "gw", "sleep 600; echo vllm serve Qwen/Qwen3-0.6B")

    def pids():
        out = subprocess.run(["tmux", "-L", sock, "display", "-p", "#{pid} #{pane_pid}"], capture_output=True,
                             text=True, user=attacker.uid, env={"HOME": str(attacker.home), "PATH": "/usr/bin:/bin"})
        return [int(x) for x in out.stdout.split()]

    server, pane = pids()
    yield server, pane
    subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, user=attacker.uid,
                   env={"HOME": str(attacker.home), "PATH": "/usr/bin:/bin"})


def test_a_cmdline_target_matches_the_engine_not_what_carries_its_text(attacker, daemon_factory, root_process,
                                                                      tmux_server):
    """Finding 3: the admin's `pgrep -af` loop (root), the user's own loop and a tmux server whose argv holds
    the session command; before, each of them (and the tmux's windows) was killed with the engine."""
    loop = "while :; do pgrep -af 'vllm serve .*Qwen' >/dev/null; sleep 0.2; done"
    admins_loop = root_process("sh", "-c", loop)
    users_loop = attacker.popen(["sh", "-c", loop])
    server, pane = tmux_server
    engine = attacker.start_engine("progress", "vllm", "serve", "Qwen/Qwen3-0.6B")
    d = daemon_factory(engine_config(engine.url, 'kind = "cmdline"\npattern = "vllm serve .*Qwen"'))
    stalled(d, engine)
    killed = wait_event(d, "engine_killed")
    assert "killed victim: 2 processes" in killed["message"]
    wait_for(lambda: not engine.alive(), 10, what="the engine's tree to be gone")
    assert admins_loop.poll() is None and users_loop.poll() is None
    assert os.path.exists(f"/proc/{server}") and os.path.exists(f"/proc/{pane}")
    assert d.stop() == 0


def test_a_discovered_engine_is_only_alerted_on(attacker, daemon_factory):
    """Anyone can start a server that looks like vLLM; before, its stall made root kill by default."""
    engine = attacker.start_engine("progress", "vllm", "serve", "Qwen/Qwen3-0.6B")
    d = daemon_factory('[engines]\ndiscover_interval = "1s"\n').start()
    d.wait_log(f"discovered vllm serving on port {engine.port}")
    wait_for(lambda: f'gpuwarden_engine_up{{engine="vllm-{engine.port}"}} 1.0' in d.metrics(), 15,
             what="the discovered engine's metrics")
    engine.set_mode("stall")
    wait_event(d, "engine_stall", timeout=120, interval=1)  # defaults: 30 s min_stall, 5 s scrapes
    time.sleep(3)
    assert not events_of(d, "engine_killed") and engine.alive() == engine.pids()
    assert d.stop() == 0


def test_a_target_wider_than_max_kill_processes_is_refused(attacker, daemon_factory):
    engine = attacker.start_engine("progress", "--orphans")
    d = daemon_factory(engine_config(engine.url, max_kill_processes="2"))
    stalled(d, engine)
    refused = wait_event(d, "kill_refused")
    assert "resolves to 3 processes, more than max_kill_processes (2)" in refused["message"]
    assert engine.alive() == engine.pids() and not events_of(d, "engine_killed")
    assert d.stop() == 0


def test_check_and_probe_show_what_a_kill_would_take(attacker, tmp_path):
    engine = attacker.start_engine("progress", "--orphans")
    pidfile = tmp_path / "one.pid"
    pidfile.write_text("1\n")
    config = tmp_path / "gpuwarden.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n' + engine_config(engine.url, name="users")
                      + engine_config(engine.url, f'kind = "pidfile"\npidfile = "{pidfile}"', name="one"))
    check = subprocess.run([*GPUWARDEN, "--config", str(config), "check", "--show"], capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stderr
    users = check.stdout.split("# engine users: a kill now would take\n")[1].split("# engine one")[0]
    assert sorted(int(line.split()[1]) for line in users.splitlines()) == sorted(engine.pids())
    assert all(line.split()[2] == attacker.name for line in users.splitlines())
    assert "fake_engine.py --port" in users
    one = check.stdout.split("# engine one: a kill now would take\n")[1]
    assert one.startswith("#   refused 1 root ") and "PID 1" in one
    probe = subprocess.run([*GPUWARDEN, "probe", engine.url], capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    shown = [line.split()[1] for line in probe.stdout.split("as a port target would kill them:\n")[1].splitlines()]
    assert sorted(map(int, shown)) == sorted(engine.pids())
