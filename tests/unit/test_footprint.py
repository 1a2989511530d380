"""What `gpuwarden run` loads at start (issue 27): the web stack, the HTTP client and alert delivery come with the
part that uses them (the exporter, the first engine or Alertmanager target, the first apprise target), and the
configuration needs no pydantic. Checked in a fresh interpreter; how long and how much is bench/footprint_bench.py."""

import subprocess
import sys

LATER = ("pydantic", "httpx", "apprise", "prometheus_client", "wsgiref", "http.server", "urllib.request", "email",
         "xml.sax", "uuid", "platform", "shutil", "hashlib", "html",
         "gpuwarden.web.statuspage", "gpuwarden.alert.messages",
         # a crash loop's cache quarantine, a file source's text formats, an engine's Docker log, an alert's retry
         "gpuwarden.act.quarantine", "gpuwarden.kernel.formats", "gpuwarden.engine.dockerlog", "calendar", "random")
# The records `run` loads that are compared by value (by the code or its tests) or hashed, so whose dataclass
# compiles __eq__ (and __hash__, __repr__) at import; every other one is `@plain` or says eq=False, repr=False
COMPARED = {"gpuwarden.core.model.ConditionKey", "gpuwarden.core.model.Event", "gpuwarden.core.conditions.Condition",
            "gpuwarden.core.incidents.Incident", "gpuwarden.gpu.pci.PcieCap", "gpuwarden.gpu.recovery.Loss",
            *(f"gpuwarden.core.policy.{action}" for action in ("Kill", "Quarantine", "Refuse", "AlertOnly", "Suspect"))}


def loaded_by(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}; import sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return set(out.split())


def test_run_starts_without_what_it_loads_on_demand():
    assert loaded_by("import gpuwarden.cli.main, gpuwarden.daemon") & set(LATER) == set()


def test_the_exporter_serves_its_pictures_without_reading_the_system_mime_tables():
    """mimetypes' tables are 0.35 MB held for good; the picture's type is known (an integration test serves one)."""
    out = subprocess.run([sys.executable, "-c", "import mimetypes\nfrom gpuwarden.web.exporter import Exporter"
                          "\nfrom gpuwarden.core.metrics import SelfMetrics"
                          "\nExporter(SelfMetrics(), '127.0.0.1', 0)\nprint(mimetypes.inited)"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.split() == ["False"]


SERVED = """import gpuwarden.cli.main, gpuwarden.daemon, socket
from gpuwarden.web.exporter import Exporter
from gpuwarden.core.metrics import SelfMetrics
exporter = Exporter(SelfMetrics(), '127.0.0.1', 0, status=lambda: {})
exporter.start()
for path in ('/metrics', '/status.json'):
    with socket.create_connection(('127.0.0.1', exporter.port), 10) as s:
        s.sendall(f'GET {path} HTTP/1.0\\r\\n\\r\\n'.encode())
        assert b' 200 OK' in s.recv(100), path
exporter.stop()"""


def test_a_daemon_serving_its_metrics_loads_no_web_stack():
    """Issue 27: the exposition is written from the snapshot and served by a small server of our own, so serving
    /metrics and a page loads neither prometheus_client nor the standard library's HTTP server and mail parser
    (about 4 MB held by every daemon). The check can fail: the status page's module comes with the first page."""
    loaded = loaded_by(SERVED)
    assert loaded & {"prometheus_client", "wsgiref", "http.server", "email", "urllib.request"} == set()
    assert "gpuwarden.web.statuspage" in loaded


def test_the_engines_log_rules_are_compiled_when_a_log_is_read_not_at_import():
    out = subprocess.run([sys.executable, "-c", "import gpuwarden.cli.main, gpuwarden.daemon\n"
                          "from gpuwarden.enginekinds import base\nfrom gpuwarden.engine.logs import LogReader\n"
                          "print(base._compiled.cache_info().currsize)\nLogReader().feed('a line no engine wrote')\n"
                          "print(base._compiled.cache_info().currsize)"],
                         capture_output=True, text=True, check=True, timeout=60).stdout.split()
    assert out[0] == "0" and int(out[1]) > 0  # the second: the check sees a compiled rule

# Each dataclass `run` loads: its name, whether it generated __eq__ or __repr__, whether its docstring was made
RECORDS = """import gpuwarden.cli.main, gpuwarden.daemon, dataclasses, sys
for module in [m for name, m in sys.modules.items() if name.startswith("gpuwarden")]:
    for c in vars(module).values():
        if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == module.__name__:
            made = (c.__doc__ or "").startswith(c.__name__ + "(")
            print(f"{module.__name__}.{c.__qualname__}", c.__dataclass_params__.eq or c.__dataclass_params__.repr, made)
"""


def test_the_records_run_loads_compile_no_method_they_do_not_use():
    """Python 3.11 compiles each method a dataclass generates from source at import (about 0.1 ms each): __eq__,
    __hash__ and __repr__ of every record were 15 ms of each start, and a class with no docstring has one made
    through inspect.signature. A new record is `@plain` (gpuwarden/core/plain.py) or is added to COMPARED."""
    out = subprocess.run([sys.executable, "-c", RECORDS], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    rows = [line.split() for line in out.splitlines()]
    assert len(rows) > 60  # the check sees the records
    assert {name for name, generated, _ in rows if generated == "True"} == COMPARED
    assert [name for name, _, made in rows if made == "True"] == []
