"""An engine's /metrics text turned into one sample, pure. Only the lines a profile needs are parsed."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.engine.profiles import BY_NAME, PROFILES, Profile


class UnparsableMetrics(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class EngineSample:
    profile: str
    running: float | None  # None: the engine does not say (never guess 0)
    waiting: float | None
    generated: float | None
    prompt: float | None
    progress: float | None
    latency_sum: float | None
    latency_count: float | None
    spec_accepted: float | None
    spec_draft: float | None

    @property
    def spec_acceptance(self) -> float | None:
        if self.spec_accepted is None or not self.spec_draft:
            return None
        return self.spec_accepted / self.spec_draft


def detect(text: str) -> Profile | None:
    """The profile whose prefix the first metric line carries."""
    for line in text.splitlines():
        if line and not line.startswith("#"):
            return next((p for p in PROFILES if line.startswith(p.prefix)), None)
    for line in text.splitlines():  # only HELP/TYPE lines (families with no samples yet)
        if line.startswith("# TYPE "):
            return next((p for p in PROFILES if line[7:].startswith(p.prefix)), None)
    return None


def parse(text: str, profile: str = "auto") -> EngineSample:
    chosen = detect(text) if profile == "auto" else BY_NAME[profile]
    if chosen is None:
        raise UnparsableMetrics("no known engine's metrics in the body")
    values = _values(text, chosen.names())
    first = lambda names: next((values[n] for n in names if n in values), None)  # noqa: E731
    latency = chosen.latency
    return EngineSample(
        profile=chosen.name,
        running=first(chosen.running),
        waiting=first(chosen.waiting),
        generated=first(chosen.generated),
        prompt=first(chosen.prompt),
        progress=first(chosen.progress_names),
        latency_sum=values.get(f"{latency}_sum") if latency else None,
        latency_count=values.get(f"{latency}_count") if latency else None,
        spec_accepted=first(chosen.spec_accepted),
        spec_draft=first(chosen.spec_draft),
    )


def _values(text: str, wanted: set[str]) -> dict[str, float]:
    """Sum of the samples of each wanted name. A name with no sample is absent, not 0."""
    starts = tuple(wanted)
    lines = [line for line in text.splitlines() if line.startswith(starts)]
    try:
        families = list(text_string_to_metric_families("\n".join(lines) + "\n"))
    except (ValueError, IndexError, KeyError) as exc:
        raise UnparsableMetrics(f"malformed metrics text: {exc}") from None
    values: dict[str, float] = {}
    for family in families:
        for sample in family.samples:
            if sample.name in wanted:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values
