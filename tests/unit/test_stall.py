from gpuwarden.engine.metrics import EngineSample
from gpuwarden.engine.stall import StallDetector


def sample(running, progress, lat_sum=None, lat_count=None):
    return EngineSample("vllm", running, 0.0, progress, 0.0, progress, lat_sum, lat_count, None, None)


def run(det, samples, start=0.0, step=1.0):
    return [det.observe(s, start + i * step) for i, s in enumerate(samples)]


def test_running_without_progress_beyond_the_floor_is_a_stall_once():
    det = StallDetector(stall_multiple=4, min_stall=5, max_stall=60)
    verdicts = run(det, [sample(1, 100)] * 8)
    assert [v.stalled for v in verdicts] == [False] * 6 + [True, True]
    assert [v.new for v in verdicts] == [False] * 6 + [True, False]
    assert verdicts[6].stalled_for == 6.0 and verdicts[6].threshold == 5


def test_idle_is_never_a_stall():
    det = StallDetector(min_stall=1)
    assert not any(v.stalled for v in run(det, [sample(0, 100)] * 50))


def test_slow_but_progressing_is_not_a_stall():
    det = StallDetector(min_stall=2)
    assert not any(v.stalled for v in run(det, [sample(3, 100 + i) for i in range(100)], step=1.5))


def test_counter_reset_is_neither_progress_nor_a_stall():
    det = StallDetector(min_stall=3)
    run(det, [sample(1, 500), sample(1, 501)])
    v = det.observe(sample(1, 2), 2.0)  # restarted engine: counter went down
    assert not v.stalled
    assert [x.stalled for x in run(det, [sample(1, 2)] * 5, start=3.0)] == [False, False, False, True, True]


def test_threshold_comes_from_the_latency_histogram():
    det = StallDetector(stall_multiple=4, min_stall=1, max_stall=100)
    run(det, [sample(1, i, lat_sum=2.5 * i, lat_count=i) for i in range(1, 10)])  # 2.5 s per request
    assert det.typical == 2.5 and det.threshold == 10.0


def test_threshold_is_clamped():
    det = StallDetector(stall_multiple=4, min_stall=30, max_stall=60)
    run(det, [sample(1, i, lat_sum=100.0 * i, lat_count=i) for i in range(1, 5)])
    assert det.threshold == 60
    det = StallDetector(stall_multiple=4, min_stall=30, max_stall=60)
    run(det, [sample(1, i, lat_sum=0.1 * i, lat_count=i) for i in range(1, 5)])
    assert det.threshold == 30


def test_without_histogram_typical_comes_from_busy_periods():
    det = StallDetector(stall_multiple=4, min_stall=1, max_stall=100)
    for burst in range(3):  # three requests of 3 s each
        run(det, [sample(1, burst * 10 + i) for i in range(3)] + [sample(0, burst * 10 + 3)], start=burst * 10)
    assert det.typical == 3.0 and det.threshold == 12.0


def test_unknown_running_or_progress_gives_no_judgement():
    det = StallDetector(min_stall=1)
    assert not any(v.stalled for v in run(det, [sample(None, 5)] * 10 + [sample(1, None)] * 10))


def test_progress_after_a_stall_ends_it():
    det = StallDetector(min_stall=2)
    run(det, [sample(1, 7)] * 5)
    assert det.stalled
    v = det.observe(sample(1, 8), 10.0)
    assert not v.stalled and v.new
