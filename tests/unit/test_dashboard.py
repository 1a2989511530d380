"""The Grafana dashboard is import-ready JSON and every metric it queries is one the exporter declares."""

import json
import re

from gpuwarden.core.families import FAMILIES
from paths import ROOT


def test_dashboard_queries_only_exported_metrics():
    dashboard = json.loads((ROOT / "config/grafana/gpuwarden.json").read_text())
    assert dashboard["uid"] == "gpuwarden" and dashboard["panels"]
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    names = {n for e in exprs for n in re.findall(r"\bgpuwarden_\w+", e)}
    assert names and names <= set(FAMILIES)
