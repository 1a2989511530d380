"""A real Prometheus server scrapes the real daemon; promtool checks the shipped rules."""

import json
import subprocess
import urllib.parse
from pathlib import Path

from helpers import free_port, http_get, need, wait_for

ROOT = Path(__file__).resolve().parents[2]


def test_promtool_accepts_the_rules_and_the_scrape_config():
    promtool = need("promtool")
    rules = subprocess.run([promtool, "check", "rules", ROOT / "config/prometheus/gpuwarden-rules.yml"],
                           capture_output=True, text=True)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    cfg = subprocess.run([promtool, "check", "config", ROOT / "config/prometheus/prometheus.yml"],
                         capture_output=True, text=True)
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr


def test_prometheus_scrapes_the_exporter(daemon_factory, tmp_path):
    prometheus = need("prometheus")
    d = daemon_factory().start()
    d.wait_serving()
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: gpuwarden\n    static_configs: [{{targets: ['127.0.0.1:{d.port}']}}]\n")
    server = subprocess.Popen(
        [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        query = urllib.parse.quote("gpuwarden_build_info")

        def result():
            try:
                data = json.loads(http_get(f"http://127.0.0.1:{port}/api/v1/query?query={query}"))
            except OSError:
                return None
            return data["data"]["result"]

        [series] = wait_for(result, 60, interval=0.5, what="Prometheus to scrape gpuwarden_build_info")
        assert series["metric"]["job"] == "gpuwarden"
        assert series["metric"]["version"] and series["value"][1] == "1"
    finally:
        server.terminate()
        server.wait(10)
