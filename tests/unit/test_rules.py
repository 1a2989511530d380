"""Every built-in kernel rule against the examples and counter-examples in its own data (kernel/rules.py), and
the derivation of the Aho-Corasick hints that gate the rules (kernel/hints.py)."""

import re
from functools import cache

import pytest

from gpuwarden.core.model import Severity
from gpuwarden.kernel.classifier import Classifier, process_named, user_text
from gpuwarden.kernel.formats import parse_lines
from gpuwarden.kernel.hints import hints
from gpuwarden.kernel.records import KernelRecord
from gpuwarden.kernel.rules import (
    BOOT_RESETS,
    FORGED,
    GHES_RECORD,
    OOPS_END,
    OOPS_HEADERS,
    OOPS_HINTS,
    PROCESS_FORMATS,
    RULES,
    TRACE_LINE,
    Rule,
    anchored,
)
from paths import CORPUS

_PCI = re.compile(r"\b([0-9a-fA-F]{4,8}):[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\b")
_FORMAT_DIRECTIVE = re.compile(r"%[-#0-9.]*(?:ll|l|h|z)?[a-zA-Z]|\.\.\.")


def _events(text: str) -> list:
    classifier = Classifier()
    bursts = classifier.feed(KernelRecord(text, 100.0), 100.0) + classifier.flush(200.0, everything=True).new
    return [b.event for b in bursts]


@cache
def _corpus_texts(name: str) -> frozenset[str]:
    lines = (CORPUS / "kernel" / name).read_text().splitlines()
    return frozenset(r.text for r in parse_lines(lines, pasted=True).records)


def _format_regex(source: str) -> str:
    """A rule's provenance 'file: "format string"' as an expression: each %-directive (and an elided `...`)
    stands for any text."""
    fmt = re.search(r': "(.*)"', source).group(1).replace("\\n", "").strip()
    return ".*?".join(re.escape(part) for part in _FORMAT_DIRECTIVE.split(fmt))


def _rule_id(rule: Rule) -> str:
    return rule.name


def test_rule_names_are_unique_and_every_rule_has_examples_both_ways():
    names = [r.name for r in RULES]
    assert len(set(names)) == len(names) == 43
    assert all(r.examples and r.counter_examples for r in RULES), [r.name for r in RULES if not r.examples]


@pytest.mark.parametrize("rule", RULES, ids=_rule_id)
def test_rule_matches_its_examples_and_the_classifier_names_it(rule):
    regex = re.compile(anchored(rule.pattern))
    assert rule.hints, "a built-in rule needs hints, or every line would be tried against it"
    for example in rule.examples:
        m = regex.match(example.text)
        assert m, f"{rule.name} does not match its example {example.text!r} right after a driver's prefix"
        # the gate scans the whole line, but the hints come from the expression: the match itself holds one
        assert any(h in m.group(0) for h in rule.hints), (m.group(0), rule.hints)
        events = _events(example.text)
        if rule.quiet:  # a line that only feeds a correlation
            assert events == [], events
            continue
        assert [(e.kind, e.evidence.get("rule")) for e in events] == [(rule.kind, rule.name)], events
        if rule.name in BOOT_RESETS:  # alone, no fault before it: the driver starting the GPU (test_classifier)
            assert events[0].severity == Severity.INFO
        elif rule.kind != "xid":  # an Xid's severity is the Xid catalog's
            assert events[0].severity == rule.severity


@pytest.mark.parametrize("rule", RULES, ids=_rule_id)
def test_rule_refuses_its_counter_examples(rule):
    regex = re.compile(anchored(rule.pattern))
    assert set(FORGED) <= set(rule.counter_examples)  # the carriers of user text are every rule's counter-examples
    for text in rule.counter_examples:  # refused by the anchoring, or a line read as a user's by its structure
        assert not regex.match(text) or user_text(text), f"{rule.name} matches its counter-example {text!r}"
        assert all(e.evidence.get("rule") != rule.name for e in _events(text))


@pytest.mark.parametrize("text", FORGED)
def test_lines_that_carry_user_text_make_no_event_at_all(text):
    """A task's name, a mount option, an audit record: the kernel prints them, but a user chose the text."""
    assert _events(text) == []


@pytest.mark.parametrize("rule", [r for r in RULES if not r.quiet], ids=_rule_id)
def test_a_rule_line_inside_user_text_or_after_another_prefix_is_nothing(rule):
    """Every example, moved to the middle of a line (after a task name, a filesystem's prefix, a grep'd file
    name that is no timestamp), matches no rule: rules are anchored at the start of the message."""
    for example in rule.examples:
        for text in (f"x[1]: {example.text}", f"tmpfs: Unknown parameter '{example.text}'",
                     f"foo: {example.text}", f"gpu said {example.text}"):
            assert _events(text) == [], text


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


@pytest.mark.parametrize("fmt", PROCESS_FORMATS, ids=lambda f: f.name)
def test_process_formats_name_their_examples_process_truthfully(fmt):
    """Each example is a line of its corpus file or fits one of the format's own format strings, and names the
    pid and name it says (a crafted process name included)."""
    assert fmt.examples
    for example, pid, name in fmt.examples:
        if example.origin == "template":
            assert any(re.search(_format_regex(s), example.text) for s in fmt.sources), example.text
            assert all(d.lower().endswith("ffff") for d in _PCI.findall(example.text)), example.text
        else:
            assert example.text in _corpus_texts(example.origin), f"not a line of {example.origin}"
        assert process_named(example.text) == {"pid": pid, "name": name}, example.text


@pytest.mark.parametrize("text", [
    "amdgpu ffff:fe:1f.7: amdgpu: [gfxhub0] no-retry page fault (src_id:0 ring:24 vmid:3 pasid:32769)",
    "amdgpu ffff:fe:1f.7: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1, emitted seq=3",
    "Process information: process vllm pid 4242",  # cut: no thread part, so no pid is trusted
    "Process information: process a-name-far-too-long-for-a-comm pid 4242 thread x pid 4243",
    "NVRM: Xid (PCI:ffff:fe:1f): 79, GPU has fallen off the bus.",  # drivers before pids were printed
])
def test_lines_that_name_no_process(text):
    assert process_named(text) is None


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

    plain = R("config_0", r"fatal firmware error \d+", "gpu_reset", Severity.WARNING, "any", "m", "reset")
    folded = R("config_1", r"(?i)engine HANG detected", "gpu_reset", Severity.WARNING, "any", "m", "reset")
    assert plain.hints == ("fatal firmware error ",) and folded.hints == ()
    classifier = Classifier(extra_rules=(plain, folded))
    got = [b.event.evidence["rule"] for i, t in enumerate(("my_driver: fatal firmware error 3",
                                                           "other_driver: Engine hang detected", "benign"))
           for b in classifier.feed(KernelRecord(t, i * 100.0), 1.0)]
    assert got == ["config_0", "config_1"]


def test_the_config_disables_and_overrides_rules_by_name():
    from gpuwarden.config.settings import parse
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


# --- the derivation is exact: random texts that match a pattern hold one of its hints -------------------------

def _sample(items, rng, folded=False) -> str:
    """A random string following the parsed pattern `items` (it may still miss an anchor: callers re-check)."""
    from re import _constants as sre  # the parser's own constants, as kernel/hints.py reads them
    out = []
    for op, arg in items:
        if op is sre.LITERAL:
            ch = chr(arg)
            out.append(ch.swapcase() if folded and rng.random() < 0.5 else ch)
        elif op is sre.IN:
            out.append(_sample_class(arg, rng))
        elif op is sre.ANY:
            out.append(rng.choice("aZ0 :_-.()[]<>!"))
        elif op is sre.SUBPATTERN:
            out.append(_sample(list(arg[3]), rng, folded or bool(arg[1] & sre.SRE_FLAG_IGNORECASE)))
        elif op is sre.BRANCH:
            out.append(_sample(list(rng.choice(arg[1])), rng, folded))
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            low, high, body = arg
            out += [_sample(list(body), rng, folded) for _ in range(rng.randint(low, min(high, low + 3)))]
    return "".join(out)


def _sample_class(items, rng) -> str:
    choices = [chr(c) for c in range(32, 127) if re.fullmatch(_class_regex(items), chr(c))]
    return rng.choice(choices)


def _class_regex(items) -> str:
    from re import _constants as sre

    parts, negate = [], False
    for op, arg in items:
        if op is sre.NEGATE:
            negate = True
        elif op is sre.LITERAL:
            parts.append(re.escape(chr(arg)))
        elif op is sre.RANGE:
            parts.append(f"{re.escape(chr(arg[0]))}-{re.escape(chr(arg[1]))}")
        elif op is sre.CATEGORY:
            parts.append({sre.CATEGORY_DIGIT: r"\d", sre.CATEGORY_NOT_DIGIT: r"\D", sre.CATEGORY_SPACE: r"\s",
                          sre.CATEGORY_NOT_SPACE: r"\S", sre.CATEGORY_WORD: r"\w", sre.CATEGORY_NOT_WORD: r"\W"}[arg])
    return f"[{'^' if negate else ''}{''.join(parts)}]"


@pytest.mark.parametrize("pattern", [r.pattern for r in RULES] + [
    r"\b(?i:mode[12]) reset", r"GPU (?:psp )?mode1 reset\s*$", r"x(?:ab|abc)y",
    r"(?:uncorrectable|uncorrected) errors? (?:\(\w+\) )?(?:detected|occurred)", r"a{2,3}b+c?",
], ids=[r.name for r in RULES] + ["folded", "optional", "prefixes", "long-set", "repeats"])
def test_random_texts_that_match_hold_a_derived_hint(pattern):
    import random
    from re import _parser as sre_parse

    rng, regex, tree = random.Random(pattern), re.compile(pattern), list(sre_parse.parse(pattern))
    derived = hints(pattern)
    matched = 0
    for _ in range(400):
        text = _sample(tree, rng)
        if regex.search(text):
            matched += 1
            assert any(h in text for h in derived), (text, derived)
    assert matched >= 100, f"only {matched} of 400 samples matched: the sampler does not exercise {pattern!r}"


def test_the_cheap_start_gate_lets_through_every_line_a_rule_or_report_may_start():
    """classifier._START refuses most lines with one possessive match: it must pass every line that starts with a
    driver's prefix, an oops header, a GHES record or a report's end (every line of the corpus is tried)."""
    from gpuwarden.kernel.classifier import _START
    from gpuwarden.kernel.rules import DRIVER_START

    exact = re.compile("|".join([DRIVER_START, *(p for p, _ in OOPS_HEADERS), GHES_RECORD, OOPS_END]))
    lines = {r.text for p in (CORPUS / "kernel").rglob("*.log")
             for r in parse_lines(p.read_text().splitlines(), pasted=True).records}
    lines |= {e.text for r in RULES for e in r.examples}
    wanted = {t for t in lines if exact.match(t)}
    assert len(wanted) > 1000 and not [t for t in wanted if not _START.match(t)]
