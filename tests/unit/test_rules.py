"""Every built-in kernel rule against the examples and counter-examples in its own data (kernel/rules.py), and
the derivation of the Aho-Corasick hints that gate the rules (kernel/hints.py)."""

import re
from functools import cache

import pytest

from gpuwarden.kernel.classifier import Classifier
from gpuwarden.kernel.formats import parse_lines
from gpuwarden.kernel.hints import hints
from gpuwarden.kernel.records import KernelRecord
from gpuwarden.kernel.rules import GHES_RECORD, OOPS_END, OOPS_HEADERS, OOPS_HINTS, RULES, TRACE_LINE, Rule
from gpuwarden.model import Severity
from paths import CORPUS

_PCI = re.compile(r"\b([0-9a-fA-F]{4,8}):[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\b")
_FORMAT_DIRECTIVE = re.compile(r"%[-#0-9.]*(?:ll|l|h|z)?[a-zA-Z]|\.\.\.")


def _events(text: str) -> list:
    classifier = Classifier()
    bursts = classifier.feed(KernelRecord(text, 100.0), 100.0) + classifier.flush(200.0, everything=True).new
    return [b.event for b in bursts]


@cache
def _corpus_texts(name: str) -> frozenset[str]:
    return frozenset(r.text for r in parse_lines((CORPUS / "kernel" / name).read_text().splitlines()).records)


def _format_regex(source: str) -> str:
    """A rule's provenance 'file: "format string"' as an expression: each %-directive (and an elided `...`)
    stands for any text."""
    fmt = re.search(r': "(.*)"', source).group(1).replace("\\n", "").strip()
    return ".*?".join(re.escape(part) for part in _FORMAT_DIRECTIVE.split(fmt))


def _rule_id(rule: Rule) -> str:
    return rule.name


def test_rule_names_are_unique_and_every_rule_has_examples_both_ways():
    names = [r.name for r in RULES]
    assert len(set(names)) == len(names) == 40
    assert all(r.examples and r.counter_examples for r in RULES), [r.name for r in RULES if not r.examples]


@pytest.mark.parametrize("rule", RULES, ids=_rule_id)
def test_rule_matches_its_examples_and_the_classifier_names_it(rule):
    regex = re.compile(rule.pattern)
    assert rule.hints, "a built-in rule needs hints, or every line would be tried against it"
    for example in rule.examples:
        m = regex.search(example.text)
        assert m, f"{rule.name} does not match its example {example.text!r}"
        # the gate scans the whole line, but the hints come from the expression: the match itself holds one
        assert any(h in m.group(0) for h in rule.hints), (m.group(0), rule.hints)
        events = _events(example.text)
        if rule.quiet:  # a line that only feeds a correlation
            assert events == [], events
            continue
        assert [(e.kind, e.evidence.get("rule")) for e in events] == [(rule.kind, rule.name)], events
        if rule.kind != "xid":  # an Xid's severity is the Xid catalog's
            assert events[0].severity == rule.severity


@pytest.mark.parametrize("rule", RULES, ids=_rule_id)
def test_rule_refuses_its_counter_examples(rule):
    regex = re.compile(rule.pattern)
    for text in rule.counter_examples:
        assert not regex.search(text), f"{rule.name} matches its counter-example {text!r}"
        assert all(e.evidence.get("rule") != rule.name for e in _events(text))


@pytest.mark.parametrize("rule", RULES, ids=_rule_id)
def test_every_example_says_where_it_comes_from_truthfully(rule):
    """A corpus example is a line of that real log; a template example fits one of the rule's own format
    strings and names no GPU outside the ffff: test domain."""
    for example in rule.examples:
        if example.origin == "template":
            assert any(re.search(_format_regex(s), example.text) for s in rule.sources), example.text
            assert all(d.lower().endswith("ffff") for d in _PCI.findall(example.text)), example.text
        else:
            assert example.text in _corpus_texts(example.origin), f"not a line of {example.origin}"


@pytest.mark.parametrize(("pattern", "expected"), [
    (r"device lost from bus!", ("device lost from bus!",)),
    (r"GPU (?:reset|jobs stop) begin", ("GPU jobs stop begin", "GPU reset begin")),  # alternatives multiply out
    (r"GPU (?:psp )?mode1 reset\s*$", ("GPU mode1 reset", "GPU psp mode1 reset")),  # an optional literal too
    (r"\bring \S+ timeout", (" timeout",)),  # the most selective literal of the sequence
    (r"\b(?i:mode[12]) reset", (" reset",)),  # a case-insensitive part promises no literal
    (r"(?i)fault", ()),
    (r"fault|.*", ()),  # a branch that needs nothing: every line
    (r"a?b*", ()),
    (r"\[(?:gfx|mm)hub\d*\] page", ("] page",)),  # one literal of 6 beats two of 7 and 6
    (r"SMU\b.*(?:fail|timeout|not done)", ("SMU",)),  # one short literal beats three longer alternatives
    (r"ring [0-9]+ ok|abc", ("abc", "ring ")),
    (r"(?:uncorrectable|uncorrected) errors? (?:\(\w+\) )?(?:detected|occurred)",  # long ones beat common words
     ("uncorrectable error ", "uncorrectable errors ", "uncorrected error ", "uncorrected errors ")),
    (r"x(?:ab|abc)y", ("xaby", "xabcy")),
    (r"sq_(?=intr)intr", ("sq_intr",)),  # a look-ahead consumes nothing
])
def test_hints_derived_from_the_pattern(pattern, expected):
    assert hints(pattern) == tuple(sorted(expected))


def test_oops_hints_gate_every_report_line_the_oops_patterns_match():
    """OOPS_HINTS are the gate of the oops collector: each literal derived from its patterns holds one."""
    for pattern in (*(p for p, _ in OOPS_HEADERS), TRACE_LINE, OOPS_END):
        derived = hints(pattern)
        assert derived and all(any(h in d for h in OOPS_HINTS) for d in derived), (pattern, derived)
    assert hints(GHES_RECORD) == ("}[Hardware Error]:",)


def test_a_config_rule_gets_hints_and_a_case_insensitive_one_is_tried_on_every_line():
    from gpuwarden.kernel.rules import Rule as R

    plain = R("config_0", r"my_driver: fatal \d+", "gpu_reset", Severity.WARNING, "any", "m", "reset")
    folded = R("config_1", r"(?i)other_driver: HANG", "gpu_reset", Severity.WARNING, "any", "m", "reset")
    assert plain.hints == ("my_driver: fatal ",) and folded.hints == ()
    classifier = Classifier(extra_rules=(plain, folded))
    got = [b.event.evidence["rule"] for i, t in enumerate(("my_driver: fatal 3", "Other_Driver: hang", "benign"))
           for b in classifier.feed(KernelRecord(t, i * 100.0), 1.0)]
    assert got == ["config_0", "config_1"]


def test_the_config_disables_and_overrides_rules_by_name():
    from gpuwarden.config import parse
    from gpuwarden.kernel.watch import classifier_for

    kernel = parse('[kernel]\ndisable_rules = ["aer_corrected"]\n'
                   '[kernel.rule_severity]\namd_vram_lost = "critical"\namd_reset_begin = "info"\n').kernel
    classifier = classifier_for(kernel)
    by_rule = {r.name: r for r in RULES}

    def first(name):
        bursts = classifier.feed(KernelRecord(by_rule[name].examples[0].text, 1000.0), 1000.0)
        return [(b.event.evidence["rule"], b.event.severity) for b in bursts]

    assert first("aer_corrected") == []  # and no other rule takes the line
    assert first("amd_vram_lost") == [("amd_vram_lost", Severity.CRITICAL)]
    assert first("amd_reset_begin") == [("amd_reset_begin", Severity.INFO)]
    assert first("amd_ring_reset_start") == [("amd_ring_reset_start", by_rule["amd_ring_reset_start"].severity)]
