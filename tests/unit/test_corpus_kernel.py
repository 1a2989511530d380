"""Every real kernel log in the test corpus (tests/corpus) gives what its expected.json says."""

import json

import pytest
from kernel_helpers import classify_text, kinds

from gpuwarden.model import Severity
from paths import CORPUS

EXPECTED = json.loads((CORPUS / "kernel" / "expected.json").read_text()) if CORPUS.is_dir() else {}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_file(name, corpus):
    want = EXPECTED[name]
    events = classify_text((corpus / "kernel" / name).read_text())
    got = kinds(events)
    assert set(want["kinds"]) <= got, f"missing kinds: {set(want['kinds']) - got}"
    assert not set(want.get("forbid", ())) & got
    worst = max((e.severity for e in events), default=None)
    if want["sev"] == "none":
        assert worst is None or worst < Severity.WARNING
    elif want["sev"] == "info":
        assert worst is None or worst <= Severity.INFO
    else:
        assert worst == Severity.parse(want["sev"])
    if want.get("gpu_none"):
        assert all(e.gpu is None for e in events)


def test_every_corpus_log_is_listed(corpus):
    assert {p.name for p in (corpus / "kernel").glob("*.log")} == set(EXPECTED)
