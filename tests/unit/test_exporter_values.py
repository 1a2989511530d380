import math

from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.web import exposition


def test_nan_and_inf_never_reach_the_exporter():
    metrics = SelfMetrics()
    metrics.set("gpuwarden_engine_requests_running", 2.0, "e")
    metrics.set("gpuwarden_engine_requests_running", math.nan, "e")  # the last good value stays
    metrics.set("gpuwarden_engine_requests_waiting", math.inf, "e")
    metrics.inc("gpuwarden_engine_kills_total", "e", by=-math.inf)
    metrics.replace("gpuwarden_gpu_power_watts", {("g0", "amd", "m"): 300.0, ("g1", "amd", "m"): math.nan})
    text = exposition.render(metrics.snapshot()).decode()
    assert 'gpuwarden_engine_requests_running{engine="e"} 2.0' in text
    assert "NaN" not in text and "Inf" not in text
    assert 'gpu="g0"' in text and 'gpu="g1"' not in text


def test_a_live_gauge_is_read_at_each_scrape():
    """A value computed when read (the loop's lag while the loop is blocked): nothing has to set it, a NaN reading
    is left out like a NaN set."""
    readings = iter([0.25, 2.5, math.nan])
    metrics = SelfMetrics()
    metrics.live("gpuwarden_loop_lag_seconds", lambda: next(readings))
    scrapes = [exposition.render(metrics.snapshot()).decode() for _ in range(3)]
    assert "gpuwarden_loop_lag_seconds 0.25" in scrapes[0] and "gpuwarden_loop_lag_seconds 2.5" in scrapes[1]
    assert "gpuwarden_loop_lag_seconds " not in scrapes[2]
