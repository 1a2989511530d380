"""An engine's /metrics text turned into one sample, pure. Only the lines a profile needs are parsed."""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.engine.profiles import BY_NAME, PROFILES, Profile, Timing


class UnparsableMetrics(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class EngineSample:
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
    activity: float | None = None  # a gauge that changes with every step of work (profiles.py): a change is progress
    families: tuple[str, ...] = ()  # the sample names this reading came from

    @property
    def spec_acceptance(self) -> float | None:
        if self.spec_accepted is None or not self.spec_draft:
            return None
        return self.spec_accepted / self.spec_draft


def detect(text: str) -> Profile | None:
    """The profile with the most sample lines in the body. A server that uses prometheus_client's default
    registry prints python_gc_*, process_* and other families first, so the whole body counts."""
    counts = dict.fromkeys(PROFILES, 0)
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            line = line[7:]
        elif line.startswith("#"):
            continue
        for profile in PROFILES:
            if line.startswith(profile.prefix):
                counts[profile] += 1
    best = max(counts, key=counts.get)
    return best if counts[best] else None


def parse(text: str, profile: str = "auto") -> EngineSample:
    chosen = detect(text) if profile == "auto" else BY_NAME[profile]
    if chosen is None:
        raise UnparsableMetrics("no known engine's metrics in the body")
    values = _values(text, chosen.names())
    if not values and f"# TYPE {chosen.prefix}" not in text:  # declared families with no sample yet are fine
        raise UnparsableMetrics(f"none of {chosen.name}'s metrics in the body")
    first = lambda names: next((values[n] for n in names if n in values), None)  # noqa: E731
    progress = next((p for p in chosen.progress if any(n in values for n in p.names)), None)
    per_step = progress.per_step if progress else False
    return EngineSample(
        profile=chosen.name,
        running=first(chosen.running),
        waiting=first(chosen.waiting),
        generated=first(chosen.generated),
        progress=sum(values.get(n, 0.0) for n in progress.names) if progress else None,
        per_step=per_step,
        timing=_timing(values, chosen.token_timing if per_step else chosen.request_timing),
        first_token=_timing(values, chosen.first_token_timing) if per_step else None,
        spec_accepted=first(chosen.spec_accepted),
        spec_draft=first(chosen.spec_draft),
        activity=first(chosen.activity),
        families=tuple(sorted(values)),
    )


def _timing(values: dict[str, float], timings: tuple[Timing, ...]) -> tuple[float, float] | None:
    return next(((values[t.sum], values[t.count]) for t in timings if t.sum in values and t.count in values), None)


def _values(text: str, wanted: set[str]) -> dict[str, float]:
    """Sum of the samples of each wanted name. A name with no sample is absent, not 0; so is a name with a
    NaN or infinite sample (it says nothing usable)."""
    starts = tuple(wanted)
    lines = [line for line in text.splitlines() if line.startswith(starts)]
    try:
        families = list(text_string_to_metric_families("\n".join(lines) + "\n"))
    except (ValueError, IndexError, KeyError) as exc:
        raise UnparsableMetrics(f"malformed metrics text: {exc}") from None
    values: dict[str, float] = {}
    broken: set[str] = set()
    for family in families:
        for sample in family.samples:
            if sample.name in wanted:
                if math.isfinite(sample.value):
                    values[sample.name] = values.get(sample.name, 0.0) + sample.value
                else:
                    broken.add(sample.name)
    return {name: value for name, value in values.items() if name not in broken}
