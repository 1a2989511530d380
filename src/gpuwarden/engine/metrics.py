"""An engine's /metrics text turned into one sample, pure. Only the lines its kind's metrics name are parsed
(what each name means is the kind's: gpuwarden/enginekinds)."""

from __future__ import annotations

import math
import re

from gpuwarden import enginekinds
from gpuwarden.core.plain import plain
from gpuwarden.enginekinds.base import EngineKind, Timing


class UnparsableMetrics(ValueError):
    pass


@plain
class EngineSample:
    """One scrape of an engine, read through its kind's metric names."""

    profile: str
    running: float | None  # None: the engine does not say (never guess 0)
    waiting: float | None
    generated: float | None
    progress: float | None  # the stall signal: tokens (or steps) processed so far
    per_step: bool  # the progress counter moves on every engine step, not only when a request ends
    timing: tuple[float, float] | None  # seconds per token (per_step) or per request: (sum, count)
    first_token: tuple[float, float] | None = None  # seconds to a first token (per_step only): (sum, count)
    spec_accepted: float | None = None
    spec_draft: float | None = None
    activity: float | None = None  # a gauge that changes with every step of work (base.Metrics): a change is progress
    families: tuple[str, ...] = ()  # the sample names this reading came from

    @property
    def spec_acceptance(self) -> float | None:
        if self.spec_accepted is None or not self.spec_draft:
            return None
        return self.spec_accepted / self.spec_draft


def detect(text: str) -> EngineKind | None:
    """The kind with the most sample lines of its /metrics in the body (a `# TYPE` line of its counts too). A
    server that uses prometheus_client's default registry prints python_gc_*, process_* and other families
    first, so the whole body counts. Counted in C: a line begins after a newline (the format's line end)."""
    body = "\n" + text
    counts = {kind: body.count(f"\n{kind.metrics.prefix}") + body.count(f"\n# TYPE {kind.metrics.prefix}")
              for kind in enginekinds.all_kinds() if kind.metrics}
    best = max(counts, key=counts.get)
    return best if counts[best] else None


def chosen(text: str, profile: str) -> EngineKind:
    """The kind whose metrics the body is read as: the one named, or (auto) the one detected."""
    kind = detect(text) if profile == "auto" else enginekinds.named(profile)
    if kind is None:
        raise UnparsableMetrics("no known engine's metrics in the body")
    if kind.metrics is None:
        raise UnparsableMetrics(f"{kind.title} serves no /metrics")
    return kind


def parse(text: str, profile: str = "auto") -> EngineSample:
    kind = chosen(text, profile)
    metrics = kind.metrics
    values = _values(text, metrics.names())
    if not values and f"# TYPE {metrics.prefix}" not in text:  # declared families with no sample yet are fine
        raise UnparsableMetrics(f"none of {kind.name}'s metrics in the body")
    first = lambda names: next((values[n] for n in names if n in values), None)  # noqa: E731
    progress = next((p for p in metrics.progress if any(n in values for n in p.names)), None)
    per_step = progress.per_step if progress else False
    return EngineSample(
        profile=kind.name,
        running=first(metrics.running),
        waiting=first(metrics.waiting),
        generated=first(metrics.generated),
        progress=sum(values.get(n, 0.0) for n in progress.names) if progress else None,
        per_step=per_step,
        timing=_timing(values, metrics.token_timing if per_step else metrics.request_timing),
        first_token=_timing(values, metrics.first_token_timing) if per_step else None,
        spec_accepted=first(metrics.spec_accepted),
        spec_draft=first(metrics.spec_draft),
        activity=first(metrics.activity),
        families=tuple(sorted(values)),
    )


def _timing(values: dict[str, float], timings: tuple[Timing, ...]) -> tuple[float, float] | None:
    return next(((values[t.sum], values[t.count]) for t in timings if t.sum in values and t.count in values), None)


# a sample line: its name, labels (a quoted value may hold anything escaped), value, then maybe a timestamp and an
# exemplar (what prometheus_client's parser accepts); only the lines of the names wanted reach it. Possessive: a
# malformed line fails in one pass (with backtracking, a name and a value could split one run of letters every way:
# seconds of a line of 100,000 letters, with the GIL held, off the loop or not)
_SAMPLE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*+)[ \t]*+(?:\{(?:[^"}]|"(?:[^"\\]|\\.)*+")*+\})?+[ \t]*+([^ \t]++)'
                     r'(?:[ \t]++[^ \t#]++)?+(?:[ \t]++#.*)?+[ \t]*+')


def _values(text: str, wanted: set[str]) -> dict[str, float]:
    """Sum of the samples of each wanted name. A name with no sample is absent, not 0; so is a name with a
    NaN or infinite sample (it says nothing usable). Read line by line (prometheus_client's parser, which made a
    family, a dict of labels and a sample object of each line, took 0.5 ms of a 300-line body)."""
    values: dict[str, float] = {}
    broken: set[str] = set()
    starts = tuple(wanted)
    for line in text.splitlines():
        if not line.startswith(starts):
            continue
        sample = _SAMPLE.fullmatch(line)
        if sample is None:
            raise UnparsableMetrics(f"malformed metrics text: {line[:120]!r}")
        if (name := sample[1]) not in wanted:
            continue
        value = _number(sample[2])
        if math.isfinite(value):
            values[name] = values.get(name, 0.0) + value
        else:
            broken.add(name)
    return {name: value for name, value in values.items() if name not in broken}


def _number(text: str) -> float:
    """A sample's value as the format writes it (Go's float syntax: 1e+06, +Inf, NaN)."""
    try:
        if "_" in text:
            raise ValueError(text)  # float() takes 1_000: the format does not
        return float(text)
    except ValueError:
        raise UnparsableMetrics(f"malformed metrics text: value {text[:40]!r}") from None
