"""What `gpuwarden run` imports before it runs (issue 40: start-up CPU): the libraries only some paths use are
imported where they are first used, not by the daemon's modules, nor by an engine's start. Each check runs in a
fresh interpreter: this process has imported them all by now."""

import json
import subprocess
import sys

# loaded on first use: a page (apprise), an engine's HTTP (httpx and what it drags in), a scrape's parse
# (prometheus_client), YAML and bcrypt of a web config, uevents (pyudev), NVML (pynvml)
DEFERRED = ("apprise", "httpx", "httpcore", "anyio", "email", "prometheus_client", "yaml", "bcrypt", "pyudev",
            "pynvml")


def loaded_after(code: str) -> set[str]:
    listed = "import json, sys\nprint(json.dumps(sorted(k for k, v in sys.modules.items() if v)))"
    out = subprocess.run([sys.executable, "-c", f"{code}\n{listed}"],
                         capture_output=True, text=True, check=True).stdout
    return {name.split(".")[0] for name in json.loads(out)} & set(DEFERRED)


def test_the_daemons_modules_import_none_of_the_deferred_libraries():
    assert loaded_after("import gpuwarden.cli.main, gpuwarden.daemon") == set()


def test_an_engines_start_loads_its_http_client_but_not_the_metrics_parser():
    """Scraper() imported prometheus_client's parser (30 ms) for every configured engine before "gpuwarden
    running"; the first scrape does now. An http:// engine loads no httpx either (scraper.Plain reads it);
    an https:// one does."""
    start = "from gpuwarden.engine.scraper import Scraper\nScraper('{}://127.0.0.1:9/metrics')"
    assert loaded_after(start.format("http")) == set()
    loaded = loaded_after(start.format("https"))
    assert "httpx" in loaded and loaded - {"httpx", "httpcore", "anyio", "email"} == set()


def test_httpx_comes_without_its_command_line_client():
    """httpx's __init__ imports its CLI (click, pygments) where click is installed, as apprise installs it."""
    out = subprocess.run([sys.executable, "-c", "import gpuwarden, httpx, json, sys\n"
                          "print(json.dumps(sorted({k.split('.')[0] for k, v in sys.modules.items() if v})))"],
                         capture_output=True, text=True, check=True).stdout
    assert {"httpx", "click", "pygments"} & set(json.loads(out)) == {"httpx"}


def test_discoverys_probe_of_an_http_engine_loads_no_httpx():
    """Discovery probed each engine it found through httpx (its import, 9 MB of RSS at 32 engines with its pool):
    its probes are all http://, read by scraper.Plain now."""
    assert loaded_after("from gpuwarden.engine.discovery import _answers\n_answers('http://127.0.0.1:9/metrics')") \
        == set()


def test_pynvml_is_imported_only_on_a_host_with_the_nvidia_driver():
    """pynvml's import (10 ms of CPU, its ctypes structures) came before it found no libnvidia-ml, at every start
    of a host without the driver. Without the library: no import, same answer (None), same log line; with it (a
    GPU box): imported and asked, as before."""
    out = subprocess.run([sys.executable, "-c", "import ctypes, logging, sys\nlogging.basicConfig(level='INFO')\n"
                          "try:\n    ctypes.CDLL('libnvidia-ml.so.1')\nexcept OSError:\n    driver = False\n"
                          "else:\n    driver = True\n"
                          "from gpuwarden.gpu import nvidia\nnvml = nvidia.load()\n"
                          "print(driver, nvml is None, 'pynvml' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    driver, none, imported = out.stdout.split()
    if driver == "True":
        assert imported == "True", out
    else:
        assert (none, imported) == ("True", "False"), out
        assert "NVML not available (NVML Shared Library Not Found): the NVIDIA reader is off" in out.stderr
