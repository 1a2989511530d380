import math

from gpuwarden.exporter import Exporter, SelfMetrics


def test_nan_and_inf_never_reach_the_exporter():
    metrics = SelfMetrics()
    metrics.set("gpuwarden_engine_requests_running", 2.0, "e")
    metrics.set("gpuwarden_engine_requests_running", math.nan, "e")  # the last good value stays
    metrics.set("gpuwarden_engine_requests_waiting", math.inf, "e")
    metrics.inc("gpuwarden_engine_kills_total", "e", by=-math.inf)
    metrics.replace("gpuwarden_gpu_power_watts", {("g0", "amd", "m"): 300.0, ("g1", "amd", "m"): math.nan})
    from prometheus_client import generate_latest

    text = generate_latest(Exporter(metrics, "127.0.0.1", 0).registry).decode()
    assert 'gpuwarden_engine_requests_running{engine="e"} 2.0' in text
    assert "NaN" not in text and "Inf" not in text
    assert 'gpu="g0"' in text and 'gpu="g1"' not in text
