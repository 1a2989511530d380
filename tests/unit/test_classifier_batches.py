"""`Classifier.feed_all` in batches gives exactly what feeding one record at a time through `feed` gives: the same
events started by the same records, with the same counts, and the same flushes. Any batch-level shortcut (a scan
that skips the lines no rule can want) must keep this, so the inputs are the ones such a shortcut can get wrong:
every kernel corpus (the rules' own and the held-out one), the rules' examples, and seeded random mixes of benign
noise, fault storms, oops reports and stray stack frames, a held ring timeout followed by its process line, by an
unrelated line or by nothing (released by a flush), a record whose text holds a "\\n", and a config rule (which
must see every line)."""

import random

import pytest

from gpuwarden.core.model import Severity
from gpuwarden.kernel.classifier import Burst, Classifier
from gpuwarden.kernel.formats import parse_lines
from gpuwarden.kernel.records import KernelRecord
from gpuwarden.kernel.rules import PROCESS_FORMATS, RULES, Rule

BATCHES = (2, 7, 16, 17, 64, 1000)  # around and far past any small-batch cut-over
STEP = 0.0015  # the caller's clock per batch: a held line (2 ms) is released by the flush after next, or sooner

NOISE = [
    "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
    "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
    "docker0: port 1(veth1234) entered forwarding state",
    "amdgpu 0000:03:00.0: amdgpu: ring gfx_0.0.0 uses VM inv eng 0 on hub 0",
    "[drm] PCIE GART of 512M enabled (table at 0x000000801FB00000).",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.14",
    "kfd kfd: amdgpu: added device 1002:7550",
    "",
    "   ",
    "WARNING: CPU: 3 PID: 1 at kernel/x.c:1 f+0x1/0x2",
]
HELD = [ex.text for r in RULES if r.process_follows for ex in r.examples]
HELD_RULES = {r.name for r in RULES if r.process_follows}
PROCESS_LINES = [example[0].text for f in PROCESS_FORMATS for example in f.examples]
PAIRED = PROCESS_LINES[0]  # names no GPU: the process line of whichever held line it follows
USB_RULE = Rule("config_0", r"new high-speed USB device", "custom", Severity.WARNING, "generic", "a USB device",
                "custom")


def _events(classifier: Classifier, records: list[KernelRecord], size: int, one_by_one: bool) -> list[tuple]:
    """Every record that started bursts (by position) and every flush's outcome, fed in batches of `size` through
    `feed_all`, or one record at a time through `feed` with the same flushes (after every `size` records)."""
    position = {id(r): i for i, r in enumerate(records)}
    started: list[tuple[object, Burst]] = []
    grown: list[tuple[int, object, int]] = []
    for k in range(0, len(records), size):
        now = 1000.0 + k // size * STEP
        part = records[k:k + size]
        if one_by_one:
            started += [(position[id(r)], b) for r in part for b in classifier.feed(r, now)]
        else:
            started += [(position[id(r)], b) for r, bursts in classifier.feed_all(part, now) for b in bursts]
        flushed = classifier.flush(now, everything=k + size >= len(records))
        started += [(f"flush {k}", b) for b in flushed.new]
        grown += [(k, b.event, b.count) for b in flushed.grown]
    return [(at, b.final, b.first, b.last, b.arrived, b.boot) for at, b in started] + grown


def _same_either_way(records: list[KernelRecord], make=Classifier) -> list[tuple]:
    """The events (of the largest batches), having checked that every batch size gives them one record at a time."""
    for size in BATCHES:
        one_by_one = _events(make(), records, size, True)
        assert _events(make(), records, size, False) == one_by_one, f"batches of {size}"
    return one_by_one


def _stamped(texts: list[str], rng: random.Random) -> list[KernelRecord]:
    """Records 1 ms apart; some carry the kernel's own metadata (a verified line), the others none (a text log)."""
    return [KernelRecord(t, i * 0.001, metadata=True, facility=0) if rng.random() < 0.5 else KernelRecord(t, i * 0.001)
            for i, t in enumerate(texts)]


def _mix(seed: int, corpus) -> list[KernelRecord]:
    rng = random.Random(seed)
    logs = sorted((corpus / "kernel").glob("*.log"))
    reports = [t for p in logs if "oops" in p.name or "trace" in p.name
               for t in [[r.text for r in parse_lines(p.read_text().splitlines()).records]]]
    frames = [line for report in reports for line in report if "+0x" in line]
    examples = [ex.text for r in RULES for ex in r.examples]
    texts: list[str] = []
    while len(texts) < 3000:
        what = rng.random()
        if what < 0.55:
            texts += rng.choices(NOISE, k=rng.randint(1, 30))
        elif what < 0.65:  # a storm of one fault
            texts += [rng.choice(examples)] * rng.randint(2, 40)
        elif what < 0.75:
            texts.append(rng.choice(examples))
        elif what < 0.82:  # a whole report, or its head only (cut: closed by its window or a flush)
            report = rng.choice(reports)
            texts += report if rng.random() < 0.7 else report[:rng.randint(1, len(report))]
        elif what < 0.88:
            texts += rng.choices(frames, k=rng.randint(1, 5))
        else:  # a held line, then its process line, an unrelated line, another held line or nothing
            texts.append(rng.choice(HELD))
            texts += rng.choice([[PAIRED], [rng.choice(PROCESS_LINES)], [rng.choice(NOISE)], [rng.choice(HELD)], []])
    return _stamped(texts, rng)


def test_every_kernel_corpus_reads_the_same_in_batches(corpus):
    logs = sorted((corpus / "kernel").glob("*.log")) + sorted((corpus / "kernel" / "heldout").glob("*.log"))
    assert len(logs) >= 150
    events = 0
    for path in logs:
        records = parse_lines(path.read_text().splitlines()).records
        try:
            events += len(_same_either_way(records))
        except AssertionError as e:
            raise AssertionError(f"{path.name}: {e}") from None
    assert events > 300  # the corpora do make events: the comparison is not of empty lists


def test_the_rules_examples_read_the_same_in_batches():
    texts = [ex.text for r in RULES for ex in r.examples] + [c for r in RULES for c in r.counter_examples]
    assert len(_same_either_way(_stamped(texts, random.Random(1)))) > 50


@pytest.mark.parametrize("seed", range(4))
def test_random_mixes_read_the_same_in_batches(seed, corpus):
    records = _mix(seed, corpus)
    events = _same_either_way(records)
    processes = [e[1].evidence.get("process") for e in events if e[1].evidence.get("rule") in HELD_RULES]
    # a held line met both ends: a process line named its process, and a line or a flush released it without one
    assert any(processes) and not all(processes)
    assert any(e[1].kind == "kernel_oops" for e in events)


def test_a_record_holding_a_newline_keeps_the_lines_after_it_in_place(corpus):
    records = _mix(7, corpus)
    continued = KernelRecord(f"{records[5].text}\nSOME_KEY=value", records[5].timestamp)
    _same_either_way([*records[:5], continued, *records[6:]])


def test_a_config_rule_sees_every_line_in_batches_too(corpus):
    events = _same_either_way(_mix(11, corpus), lambda: Classifier(extra_rules=(USB_RULE,)))
    assert any(e[1].kind == "custom" for e in events)
