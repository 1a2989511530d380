"""What a resolved target expands to: never another user's process, never a kernel thread (issue 13)."""

import subprocess
import sys

import psutil
import pytest
from helpers import wait_for

from gpuwarden.engine.processes import TargetSpec, Tracker, resolve

pytestmark = pytest.mark.root


def children(pid: int) -> list[int]:
    return [c.pid for c in psutil.Process(pid).children(recursive=True)]


def test_the_tree_is_not_expanded_into_another_users_processes(attacker, root_process, tmp_path):
    """A root engine whose child runs as gwattacker (with a child of its own): a kill of the root engine
    takes the engine and its root child only; before, the user's processes went with it."""
    script = tmp_path / "engine.py"
    script.write_text("import subprocess, sys, time\n"
                      "user = ['/usr/bin/python3', '-c', 'import subprocess, time; "
                      "subprocess.Popen([\"sleep\", \"600\"]); time.sleep(600)']\n"
                      f"subprocess.Popen(user, user={attacker.uid}, group={attacker.gid}, extra_groups=[], cwd='/')\n"
                      "subprocess.Popen(['sleep', '600'])\ntime.sleep(600)\n")
    engine = root_process(sys.executable, str(script))
    wait_for(lambda: len(children(engine.pid)) == 3, 10, what="the engine's tree")
    pidfile = tmp_path / "engine.pid"
    pidfile.write_text(f"{engine.pid}\n")
    procs = Tracker().refresh(resolve(TargetSpec("pidfile", pidfile=pidfile, uid=0)))
    users = {p.pid: p.username() for p in [psutil.Process(engine.pid), *psutil.Process(engine.pid).children(True)]}
    assert sorted(p.pid for p in procs) == sorted(pid for pid, user in users.items() if user == "root")
    assert sum(user == attacker.name for user in users.values()) == 2


@pytest.mark.parametrize("pid", [2, "kworker"])
def test_kernel_threads_are_refused(tmp_path, pid):
    if pid == "kworker":
        pid = next(p.pid for p in psutil.process_iter(["ppid"]) if p.info["ppid"] == 2)
    pidfile = tmp_path / "engine.pid"
    pidfile.write_text(f"{pid}\n")
    found = resolve(TargetSpec("pidfile", pidfile=pidfile, uid=0))
    assert found.roots == [] and "kernel thread" in found.refused[0]
    assert subprocess.run(["test", "-d", f"/proc/{pid}"]).returncode == 0
