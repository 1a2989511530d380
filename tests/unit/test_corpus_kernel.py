"""Every real kernel log in the test corpus (tests/corpus) gives what its expected.json says."""

import json
import sys

import pytest
from kernel_helpers import classify_text, kinds

from gpuwarden.model import Severity
from paths import CORPUS, ROOT

sys.path.insert(0, str(ROOT / "bench"))
import kernel_eval

EXPECTED = json.loads((CORPUS / "kernel" / "expected.json").read_text()) if CORPUS.is_dir() else {}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_file(name, corpus):
    want = EXPECTED[name]
    events = classify_text((corpus / "kernel" / name).read_text())
    got = kinds(events)
    assert set(want["kinds"]) <= got, f"missing kinds: {set(want['kinds']) - got}"
    assert not set(want.get("forbid", ())) & got
    worst = max((e.severity for e in events), default=None)
    if want["sev"] == "none":  # no event at all: a benign log that yields info events expects "info"
        assert events == [], [(e.kind, e.message) for e in events]
    elif want["sev"] == "info":
        assert worst is None or worst <= Severity.INFO
    else:
        assert worst == Severity.parse(want["sev"])
    if want.get("gpu_none"):
        assert all(e.gpu is None for e in events)


def test_evaluation_report_is_clean(corpus):
    """bench/kernel_eval.py over the whole corpus: every file right and no false warning on a benign file (its
    printed report is in the README)."""
    report = kernel_eval.evaluate(corpus / "kernel")
    assert report.files == len(EXPECTED) >= 120 and report.benign >= 30
    assert (report.right, report.false_warnings, report.wrong) == (report.files, 0, {}), report.text()


def test_every_corpus_log_is_listed(corpus):
    assert {p.name for p in (corpus / "kernel").glob("*.log")} == set(EXPECTED)
