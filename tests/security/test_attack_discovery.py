"""Issue 24, finding 5: look-alike engine servers (anyone can start `python3 x.py vllm serve`) filled
[engines] max_discovered; the real engine was not watched (one log line), and each look-alike could page.
Discovery now prefers an installed engine (its program root's, writable by no one else) and makes room for it,
a crowd past the cap is one alert, and a look-alike's trouble is never a page."""

import os
import re
import shutil
import subprocess
import sys
import time

import pytest
from helpers import FAKE_ENGINE, free_port, wait_for

pytestmark = pytest.mark.root
CAP, CROWD = 3, 5  # room for one more installed engine of another test on this host


@pytest.fixture
def installed_engine(tmp_path, corpus):
    """fake_engine.py installed by root as /…/bin/vllm (0755 in a 0755 root folder), run as an interpreter's
    script, the way a venv's `vllm serve` runs."""
    bin_dir = tmp_path / "opt" / "bin"
    bin_dir.mkdir(parents=True)
    program = bin_dir / "vllm"
    shutil.copy(FAKE_ENGINE, program)
    program.chmod(0o755)
    for folder in (bin_dir, bin_dir.parent):
        folder.chmod(0o755)
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(program), "serve", "Qwen/Qwen3-0.6B", "--port", str(port),
                             "--dump", str(corpus / "metrics" / "vllm-01.prom"),
                             "--pids", str(tmp_path / "installed.pids")], start_new_session=True)
    yield port
    for pid in (tmp_path / "installed.pids").read_text().split():
        try:
            os.kill(int(pid), 9)
        except ProcessLookupError:
            pass
    proc.wait(10)


def watched(d) -> list[str]:
    return re.findall(r'^gpuwarden_engine_up\{engine="([^"]+)"\} ', d.metrics(), re.M)


def test_an_installed_engine_takes_a_lookalikes_place_and_a_crowd_is_one_alert(attacker, daemon_factory, corpus,
                                                                                request):
    for _ in range(CROWD):  # look-alikes, past the cap
        attacker.start_engine("progress", "vllm", "serve", "Qwen/Qwen3-0.6B")
    d = daemon_factory(f'[engines]\ndiscover_interval = "1s"\nmax_discovered = {CAP}\n').start()
    d.wait_serving()
    wait_for(lambda: len(watched(d)) == CAP, 30, what="the cap filled with look-alikes")
    port = request.getfixturevalue("installed_engine")
    wait_for(lambda: f'gpuwarden_engine_up{{engine="vllm-{port}"}} 1.0' in d.metrics(), 30, interval=0.5,
             what="the installed engine watched")
    # a look-alike made room (the crowd's, or another test's on this host: discovery sees them all)
    assert re.findall(r"no longer watching (\w+-\d+), a server that only looks like an engine", d.log())
    time.sleep(3)  # more discovery rounds
    floods = [e for e in d.events() if e["kind"] == "discovery_flood"]
    assert len(floods) == 1 and floods[0]["severity"] == "warning", floods
    assert f"than [engines] max_discovered ({CAP}) watches" in floods[0]["message"]
    assert d.stop() == 0
