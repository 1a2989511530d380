"""What `gpuwarden run` loads at start (issue 27): the web stack, the HTTP client and alert delivery come with the
part that uses them (the exporter, the first engine or Alertmanager target, the first apprise target), and the
configuration needs no pydantic. Checked in a fresh interpreter; how long and how much is bench/footprint_bench.py."""

import subprocess
import sys

LATER = ("pydantic", "httpx", "apprise", "prometheus_client", "wsgiref", "http.server", "urllib.request", "email",
         "xml.sax")


def loaded_by(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}; import sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return set(out.split())


def test_run_starts_without_what_it_loads_on_demand():
    assert loaded_by("import gpuwarden.cli, gpuwarden.daemon") & set(LATER) == set()


def test_the_check_sees_a_module_loaded_on_demand():
    """The check can fail: building the exporter brings the web stack."""
    loaded = loaded_by("from gpuwarden.exporter import Exporter, SelfMetrics; Exporter(SelfMetrics(), '127.0.0.1', 0)")
    assert "prometheus_client" in loaded
