"""What `gpuwarden run` loads at start (issue 27): the web stack, the HTTP client and alert delivery come with the
part that uses them (the exporter, the first engine or Alertmanager target, the first apprise target), and the
configuration needs no pydantic. Checked in a fresh interpreter; how long and how much is bench/footprint_bench.py."""

import subprocess
import sys

LATER = ("pydantic", "httpx", "apprise", "prometheus_client", "wsgiref", "http.server", "urllib.request", "email",
         "xml.sax", "uuid", "platform", "shutil", "hashlib", "html", "gpuwarden.statuspage", "gpuwarden.alert.messages")


def loaded_by(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}; import sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return set(out.split())


def test_run_starts_without_what_it_loads_on_demand():
    assert loaded_by("import gpuwarden.cli, gpuwarden.daemon") & set(LATER) == set()


def test_the_exporter_serves_its_pictures_without_reading_the_system_mime_tables():
    """mimetypes' tables are 0.35 MB held for good; the picture's type is known (an integration test serves one)."""
    out = subprocess.run([sys.executable, "-c", "import mimetypes\nfrom gpuwarden.exporter import Exporter, SelfMetrics"
                          "\nExporter(SelfMetrics(), '127.0.0.1', 0)\nprint(mimetypes.inited)"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.split() == ["False"]


def test_the_check_sees_a_module_loaded_on_demand():
    """The check can fail: building the exporter brings the web stack."""
    loaded = loaded_by("from gpuwarden.exporter import Exporter, SelfMetrics; Exporter(SelfMetrics(), '127.0.0.1', 0)")
    assert "prometheus_client" in loaded


def test_the_engines_log_rules_are_compiled_when_a_log_is_read_not_at_import():
    out = subprocess.run([sys.executable, "-c", "import gpuwarden.cli, gpuwarden.daemon\n"
                          "from gpuwarden.enginekinds import base\nfrom gpuwarden.engine.logs import LogReader\n"
                          "print(base._compiled.cache_info().currsize)\nLogReader().feed('a line no engine wrote')\n"
                          "print(base._compiled.cache_info().currsize)"],
                         capture_output=True, text=True, check=True, timeout=60).stdout.split()
    assert out[0] == "0" and int(out[1]) > 0  # the second: the check sees a compiled rule
