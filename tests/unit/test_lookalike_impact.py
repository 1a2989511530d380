"""Issue 24: a discovered server that only looks like an engine is never a page, even when its crash loop takes
it "down" (severity by impact would page for an engine of the owner's)."""

from gpuwarden.core.conditions import impact
from gpuwarden.core.model import Event, Severity


def test_a_lookalikes_crash_loop_is_no_page_and_an_engines_is():
    loop = Event("engine_crash_loop", Severity.CRITICAL, "x exited 3 times", 1.0, engine="vllm-8000")
    assert impact(loop) == Severity.CRITICAL
    lookalike = Event("engine_crash_loop", Severity.CRITICAL, "x exited 3 times", 1.0, engine="vllm-8000",
                      evidence={"lookalike": True})
    assert impact(lookalike) == Severity.WARNING
