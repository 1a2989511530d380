"""What a kill never takes: PID 1, the daemon and its ancestors, read up the parent chain of /proc/PID/stat (it
was psutil's parents(): a millisecond of every look at an engine). Real processes: a shell between this test and
the interpreter that asks."""

import json
import os
import subprocess
import sys

ASK = ("import json, os, psutil\nfrom gpuwarden.engine.processes import _protected\n"
       "parents = [p.pid for p in psutil.Process().parents()]\n"
       "print(json.dumps([sorted(_protected()), os.getpid(), os.getppid(), parents]))")


def test_the_daemon_and_every_ancestor_are_protected_and_nothing_else():
    sibling = subprocess.Popen(["sleep", "30"])
    try:
        out = subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0"; true', ASK], capture_output=True, text=True,
                             check=True).stdout
    finally:
        sibling.kill()
        sibling.wait()
    protected, asker, shell, parents = json.loads(out)
    assert {asker, shell, os.getpid(), 1} <= set(protected)  # itself, the shell, this test, init
    assert set(protected) == {1, asker, *parents}  # what psutil's parents() gave, exactly
    assert sibling.pid not in protected
