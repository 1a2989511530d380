"""A sixth engine kind is one module plus its registration (docs/engines.md, "Adding an engine kind"): the
example module is taken from that page as written, registered the way enginekinds/__init__.py registers the
built-in ones (here through a sitecustomize on PYTHONPATH, so that every gpuwarden process of the test has it and
no source file changes), and then each list derived from the registry is seen to take it, against a real
stand-in process of that kind (tests/integration/fake_toyllm.py) and the real daemon."""

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import GPUWARDEN, free_port, http_get, wait_for

from paths import ROOT

FAKE = Path(__file__).with_name("fake_toyllm.py")


def example_module() -> str:
    text = (ROOT / "docs" / "engines.md").read_text()
    section = text[text.index("## Adding an engine kind"):]
    return re.search(r"^```python\n(.*?)^```", section, re.S | re.M)[1]


@pytest.fixture
def toyllm(tmp_path):
    """The environment of a gpuwarden with the kind registered, and a ToyLLM serving on loopback."""
    kinds = tmp_path / "kinds"
    kinds.mkdir()
    (kinds / "toyllm.py").write_text(example_module())
    (kinds / "sitecustomize.py").write_text("from gpuwarden import enginekinds\nimport toyllm\n\n"
                                            "enginekinds.register(toyllm.KIND)\n")
    port = free_port()
    server = subprocess.Popen([sys.executable, str(FAKE), "--port", str(port), "toyllm", "serve"],
                              start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def answers():
        try:
            return http_get(f"{url}/metrics", timeout=1)
        except OSError:
            return None
    wait_for(answers, 15, what="ToyLLM's /metrics")
    yield {**os.environ, "PYTHONPATH": str(kinds)}, url, server
    server.kill()
    server.wait()


def gpuwarden(env, *args, config: Path | None = None):
    where = ("--config", str(config)) if config else ()
    return subprocess.run([*GPUWARDEN, *where, *args], capture_output=True, text=True, timeout=60, env=env)


def calls(url: str) -> int:
    return int(http_get(f"{url}/calls"))


def set_mode(url: str, mode: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{url}/mode/{mode}", method="POST"), timeout=2).read()


def test_config_takes_the_registered_kind_and_refuses_it_unregistered(toyllm, tmp_path):
    env, url, _ = toyllm
    config = tmp_path / "toyllm.toml"
    config.write_text(f'[[engine]]\nname = "toy"\nmetrics_url = "{url}/metrics"\nprofile = "toyllm"\n'
                      'canary = "toyllm"\n')
    out = gpuwarden(env, "check", config=config)
    assert out.returncode == 0, out.stderr
    bare = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    out = gpuwarden(bare, "check", config=config)
    assert out.returncode != 0 and "unknown engine kind 'toyllm'" in out.stderr, out.stderr
    assert "one of auto, vllm, sglang, llamacpp, tgi, ollama" in out.stderr


def test_probe_lists_the_kind_and_reads_its_metrics(toyllm):
    env, url, _ = toyllm
    assert "toyllm" in gpuwarden(env, "probe", "--help").stdout
    out = gpuwarden(env, "probe", "--json", "--profile", "toyllm", f"{url}/metrics")
    report = json.loads(out.stdout)
    assert out.returncode == 0 and report["up"] and report["profile"] == "toyllm", out.stdout + out.stderr
    assert report["running"] == 0.0 and report["progress"] == "per step"
    auto = json.loads(gpuwarden(env, "probe", "--json", f"{url}/metrics").stdout)  # recognised by its prefix
    assert auto["profile"] == "toyllm"


def test_discovery_finds_a_running_server_of_the_kind(toyllm):
    env, url, server = toyllm
    found = subprocess.run([sys.executable, "-c", "import json\nfrom gpuwarden.engine.discovery import discover\n"
                            "print(json.dumps([[f.profile, f.pid, f.port] for f in discover()]))"],
                           capture_output=True, text=True, timeout=60, env=env, check=True).stdout
    assert ["toyllm", server.pid, int(url.rsplit(":", 1)[1])] in json.loads(found)


def test_the_daemon_sends_its_canary_and_judges_its_stall_from_its_metrics(toyllm, daemon_factory):
    env, url, server = toyllm
    d = daemon_factory(f'[[engine]]\nname = "toy"\nmetrics_url = "{url}/metrics"\nprofile = "toyllm"\n'
                       'scrape_interval = "0.5s"\nmin_stall = "2s"\ncanary_interval = "1s"\nkill_grace = "1s"\n',
                       env=env).start()
    d.wait_serving()
    wait_for(lambda: calls(url) > 0, 20, what="the canary's POST /generate")  # idle: the canary asks a token
    wait_for(lambda: 'gpuwarden_engine_canaries_total{engine="toy",outcome="ok"}' in d.metrics(), 15,
             what="an answered canary")
    set_mode(url, "progress")
    time.sleep(2)  # tokens move: no stall
    assert not [e for e in d.events() if e["kind"] == "engine_stall"]
    set_mode(url, "stall")
    stall = wait_for(lambda: next((e for e in d.events() if e["kind"] == "engine_stall"), None), 30, interval=0.2,
                     what="an engine_stall event")
    assert stall["engine"] == "toy" and stall["evidence"]["figures"]["running"] == 2, json.dumps(stall)
    assert stall["evidence"]["source"] == "metrics"
    wait_for(lambda: server.poll() is not None, 20, what="the stalled ToyLLM killed")
    assert d.stop() == 0
