"""Issue 24, finding 6: a user nests folders 1,100 deep in a compile cache; root's cache walk recursed into it
and died of a RecursionError (a traceback, nothing quarantined). Now the walk is flat and bounded: the cache is
refused with why, and every other cache is still handled."""

import json
import subprocess

import pytest
from helpers import GPUWARDEN

pytestmark = pytest.mark.root
DEPTH = 1100


@pytest.fixture
def deep(attacker):
    yield attacker.home / ".triton" / "cache"
    attacker.run("rm", "-rf", str(attacker.home / ".triton"))  # shutil.rmtree recurses too


def test_a_cache_nested_1100_deep_is_refused_without_a_traceback(attacker, deep, tmp_path):
    attacker.run("/usr/bin/python3", "-c", "import os, sys\nos.makedirs(sys.argv[1])\nos.chdir(sys.argv[1])\n"
                 "open('kernel.so', 'w').close()\n"  # poisoned at its top
                 "for _ in range(int(sys.argv[2])):\n    os.mkdir('d')\n    os.chdir('d')\n"
                 "open('bottom.so', 'w').close()\n", str(deep), str(DEPTH))
    shallow = tmp_path / "root-cache"
    (shallow / "fx").mkdir(parents=True)
    (shallow / "fx" / "a.so").touch()
    config = tmp_path / "gpuwarden.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                      f"[cache]\ndirs = {json.dumps([str(deep), str(shallow)])}\n")
    out = subprocess.run([*GPUWARDEN, "--config", str(config), "quarantine", "--dry-run"], capture_output=True,
                         text=True, timeout=120)
    assert "Traceback" not in out.stderr and "RecursionError" not in out.stderr, out.stderr[-2000:]
    assert "refused: it nests folders more than 64 deep" in out.stdout, out.stdout
    assert f"would move {shallow}" in out.stdout
    assert (deep / "kernel.so").exists()
