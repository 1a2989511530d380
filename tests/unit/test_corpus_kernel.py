"""Every real kernel log in the test corpus (tests/corpus) gives what its expected.json says."""

import json
import sys

import pytest
from kernel_helpers import classify_text, kinds

from gpuwarden.core.model import Severity
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


HELD_OUT = "kernel/heldout"  # real logs of threads no other corpus file came from, quoted by no rule example


def test_held_out_logs_are_read_right(corpus):
    """Issue 23's bar on unseen logs: at least 95 % of the held-out files fully right, no warning on a benign one
    (the score is in docs/kernel-rules.md)."""
    report = kernel_eval.evaluate(corpus / HELD_OUT)
    assert report.files == len(list((corpus / HELD_OUT).glob("*.log"))) >= 25 and report.benign >= 10
    assert report.right >= 0.95 * report.files and report.false_warnings == 0, report.text()


HELD_OUT_37 = "kernel/heldout37"  # issue 37's: expectations committed before the classifier ran on them


def test_issue_37_held_out_logs_are_read_right(corpus):
    """Issue 37's bar on its own unseen logs: at least 97 % fully right, no warning on a benign one (the score is in
    docs/kernel-rules.md and `make bench`'s table)."""
    report = kernel_eval.evaluate(corpus / HELD_OUT_37)
    assert report.files == len(list((corpus / HELD_OUT_37).glob("*.log"))) >= 20 and report.benign >= 7
    assert report.right >= 0.97 * report.files and report.false_warnings == 0, report.text()


HELD_OUT_37C = "kernel/heldout37c"  # issue 37's confirmation: collected after its code, expectations committed first


# Benign in the expectations (an oops in a filesystem, no GPU driver in sight: issue 37's brief calls such logs
# benign), a `kernel_oops` warning in the catalog (any crashing oops is "kernel oops outside the GPU drivers",
# corpus 082-130): wrong here until that disagreement is decided, and the only files allowed to be
OOPS_OUTSIDE_GPU_DRIVERS = {"c09-benign-bcachefs-null-deref-oops-minio-ctime.log",
                            "c10-benign-usb-disk-bcachefs-io-error-null-deref-header.log"}


def test_issue_37_confirmation_logs_are_read_right(corpus):
    """Issue 37's confirmation batch, collected after its code was done: every file fully right (GPU addresses
    included) but the two oopses outside any GPU driver above (the score, 32/34, is in docs/kernel-rules.md and
    `make bench`'s table, against the 97 % goal)."""
    report = kernel_eval.evaluate(corpus / HELD_OUT_37C)
    assert report.files == len(list((corpus / HELD_OUT_37C).glob("*.log"))) >= 30 and report.benign >= 10
    assert set(report.wrong) <= OOPS_OUTSIDE_GPU_DRIVERS, report.text()
    assert report.false_warnings <= len(OOPS_OUTSIDE_GPU_DRIVERS), report.text()


HELD_OUT_37D = "kernel/heldout37d"  # issue 37's second confirmation: collected on main after heldout37c's fixes,
# expectations written by docs/kernel-rules.md and committed (2902b83) before its one run; no classifier change since

# Wrong in its one run, kept as it was (heldout37d/SOURCES.md, Score): a soft lockup pasted from rsyslog's wall
# message (`Message from syslogd@host at …` then ` kernel:[stamp] watchdog: BUG: soft lockup …`), a form no
# parser reads, so the `kernel_oops` warning the catalog makes of an oops outside the GPU drivers is missing
WALL_MESSAGE_37D = {"d17-oops-soft-lockup-chia-plot-syslogd-wall-message.log"}


def test_issue_37_second_confirmation_logs_are_read_right(corpus):
    """Issue 37's second confirmation batch, unseen until its one run: at least 97 % fully right (GPU addresses
    included), no warning on a benign file, and no miss but the wall-message paste above (35/36)."""
    report = kernel_eval.evaluate(corpus / HELD_OUT_37D)
    assert report.files == len(list((corpus / HELD_OUT_37D).glob("*.log"))) >= 30 and report.benign >= 15
    assert set(report.wrong) <= WALL_MESSAGE_37D, report.text()
    assert report.right >= 0.97 * report.files and report.false_warnings == 0, report.text()


@pytest.mark.parametrize("held_out", [HELD_OUT, HELD_OUT_37, HELD_OUT_37C, HELD_OUT_37D])
def test_no_rule_example_quotes_a_held_out_log(corpus, held_out):
    from gpuwarden.kernel.formats import parse_lines
    from gpuwarden.kernel.rules import PROCESS_FORMATS, RULES

    held = {r.text for p in (corpus / held_out).glob("*.log")
            for r in parse_lines(p.read_text().splitlines(), pasted=True).records}
    examples = [e for r in RULES for e in r.examples] + [e for f in PROCESS_FORMATS for e, *_ in f.examples]
    # a held-out line may be word for word a line of a quoted corpus file (the same driver message on a GPU at the
    # same address: heldout37c's c01 and c11): such an example is that corpus file's, never the held-out log's
    shared = [e for e in examples if e.text in held]
    assert held and all(e.origin != "template" and e.text in (corpus / "kernel" / e.origin).read_text()
                        for e in shared), shared
