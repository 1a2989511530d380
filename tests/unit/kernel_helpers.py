"""Helpers for kernel tests: run the file parser and the classifier over text, as `replay` does."""

from gpuwarden.core.model import Event
from gpuwarden.kernel.classifier import Classifier
from gpuwarden.kernel.formats import parse_lines


def classify_text(text: str, classifier: Classifier | None = None) -> list[Event]:
    classifier = classifier or Classifier()
    bursts = [b for r in parse_lines(text.splitlines(), pasted=True).records
              for b in classifier.feed(r, 1000.0)]
    bursts += classifier.flush(1000.0, everything=True).new
    return [b.final for b in bursts]


def kinds(events: list[Event]) -> set[str]:
    return {f"xid:{e.evidence['xid']}" if e.kind == "xid" else e.kind for e in events}
