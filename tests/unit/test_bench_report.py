"""`make bench`'s writer (bench/report.py): the table of FIGURE lines, and only the marked part of a file."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import report


def test_table_escapes_pipes_and_says_which_goals_are_met_missed_or_absent():
    figures = [{"name": "p99", "value": 3.21, "unit": "ms", "alternative": "`journalctl | grep` 40 ms",
                "goal": "< 10 ms", "met": True},
               {"name": "rate", "value": 470_000, "unit": "lines/s", "alternative": "grep", "goal": "≥ 1 M/s",
                "met": False},
               {"name": "size", "value": 39.4, "unit": "MB", "alternative": "", "goal": "", "met": None}]
    rows = report.table(figures, ["x.py (exit 1)"], "now").splitlines()
    assert rows[2] == "| p99 | 3.21 ms | `journalctl \\| grep` 40 ms | < 10 ms | met |"
    assert rows[3] == "| rate | 470,000 lines/s | grep | ≥ 1 M/s | **missed** |"
    assert rows[4] == "| size | 39.4 MB |  | — | no goal set |"
    assert "Not measured: x.py (exit 1)." in rows


def test_only_the_text_between_the_markers_is_replaced(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"head\n{report.BEGIN}\nold\n{report.END}\ntail\n")
    report.write_between(readme, "new\n")
    assert readme.read_text() == f"head\n{report.BEGIN}\nnew\n{report.END}\ntail\n"
    (tmp_path / "bare.md").write_text("no markers\n")
    with pytest.raises(SystemExit, match="markers"):
        report.write_between(tmp_path / "bare.md", "new\n")


def test_a_slow_bench_s_figures_come_from_its_results_file_with_their_date(tmp_path):
    """The real-engine bench runs for minutes: make bench shows what its last --write recorded, dated."""
    results = tmp_path / "real_engines.json"
    found, note = report.recorded("real_engines_bench.py", results)
    assert found == [] and note.startswith("Not measured: real_engines_bench.py")
    results.write_text(json.dumps({
        "when": "2026-12-04 16:40 UTC", "load": "load 2.0 on 2 cores", "argv": ["--runs", "3", "--write"],
        "figures": [{"name": "stall onset to tree gone, vllm", "value": 12.1, "unit": "s", "alternative": "old 14 s",
                     "goal": "<= 13 s", "met": True}]}))
    found, note = report.recorded("real_engines_bench.py", results)
    assert [f["name"] for f in found] == ["stall onset to tree gone, vllm (recorded 2026-12-04 16:40 UTC)"]
    assert note == ("Recorded, not re-run: real_engines_bench.py --runs 3 --write, 2026-12-04 16:40 UTC, load 2.0 "
                    "on 2 cores (real engines or the device machine: minutes a run).")
    assert report.table(found, [], "now", [note]).splitlines()[-1] == note
