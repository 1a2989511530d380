from gpuwarden.engine.metrics import EngineSample
from gpuwarden.engine.stall import StallDetector, next_look


def sample(running, progress, lat_sum=None, lat_count=None, per_step=False, first_token=None):
    timing = (lat_sum, lat_count) if lat_sum is not None else None
    return EngineSample("vllm", running, 0.0, progress, progress, per_step, timing, first_token)


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


def test_counter_reset_is_not_progress():
    det = StallDetector(min_stall=3)
    run(det, [sample(1, 500), sample(1, 501)])  # progress at t=1
    v = det.observe(sample(1, 2), 2.0)  # restarted engine: counter went down
    assert not v.stalled
    assert [x.stalled for x in run(det, [sample(1, 2)] * 3, start=3.0)] == [False, False, True]  # 4 s > 3 s
    v = det.observe(sample(1, 3), 6.0)  # counting up again from the lower value is progress
    assert not v.stalled and v.new


def test_a_counter_that_drops_on_every_scrape_is_a_stall():
    det = StallDetector(min_stall=3)
    verdicts = run(det, [sample(1, 1000 - i) for i in range(6)])
    assert [v.stalled for v in verdicts] == [False] * 4 + [True, True]


def test_threshold_comes_from_the_request_timing():
    det = StallDetector(stall_multiple=4, min_stall=1, max_stall=100)
    run(det, [sample(1, i, lat_sum=2.5 * i, lat_count=i) for i in range(1, 10)])  # 2.5 s per request
    assert det.typical == 2.5 and det.threshold() == 10.0


def test_a_per_step_counter_takes_the_per_token_timing():
    """Progress that moves every step proves the engine alive within a token's time: the floor applies even
    when a request takes minutes (long-context requests)."""
    det = StallDetector(stall_multiple=4, min_stall=30, max_stall=1800)
    run(det, [sample(1, 100 * i, lat_sum=0.02 * 100 * i, lat_count=100 * i, per_step=True) for i in range(1, 10)])
    assert det.typical == 0.02 and det.threshold() == 30


def test_a_per_step_counter_allows_for_a_prefill_as_long_as_usual():
    """vLLM counts a prompt's tokens once its prefill is done: a prefill may take as long as a first token
    usually takes (12 s here), so the threshold covers that."""
    det = StallDetector(stall_multiple=4, min_stall=30, max_stall=1800)
    run(det, [sample(1, 100 * i, 0.02 * 100 * i, 100 * i, per_step=True, first_token=(12.0 * i, i))
              for i in range(1, 10)])
    assert det.typical == 12.0 and det.threshold() == 48

def test_while_a_process_spins_the_floor_applies():
    det = StallDetector(stall_multiple=4, min_stall=5, max_stall=600)
    run(det, [sample(1, i, lat_sum=100.0 * i, lat_count=i) for i in range(1, 5)])  # 100 s per request
    assert det.threshold() == 400 and det.threshold(spinning=True) == 5
    verdicts = [det.observe(sample(1, 4), 4.0 + i, spinning=True) for i in range(8)]  # last progress at t=3
    assert [v.stalled for v in verdicts] == [False] * 5 + [True] * 3
    assert verdicts[5].threshold == 5


def test_threshold_is_clamped():
    det = StallDetector(stall_multiple=4, min_stall=30, max_stall=60)
    run(det, [sample(1, i, lat_sum=100.0 * i, lat_count=i) for i in range(1, 5)])
    assert det.threshold() == 60
    det = StallDetector(stall_multiple=4, min_stall=30, max_stall=60)
    run(det, [sample(1, i, lat_sum=0.1 * i, lat_count=i) for i in range(1, 5)])
    assert det.threshold() == 30


def test_busy_spells_are_not_request_times():
    """Under continuous load a busy spell is the whole load: it says nothing about how long a request takes,
    so without timing the threshold stays at the floor however long the engine has been busy."""
    det = StallDetector(stall_multiple=4, min_stall=30, max_stall=1800)
    run(det, [sample(4, i) for i in range(3600)])  # an hour of steady traffic, one scrape a second
    run(det, [sample(0, 3600)] * 3, start=3600)
    assert det.typical is None and det.threshold() == 30


def test_unknown_running_or_progress_gives_no_judgement():
    det = StallDetector(min_stall=1)
    assert not any(v.stalled for v in run(det, [sample(None, 5)] * 10 + [sample(1, None)] * 10))


def test_progress_after_a_stall_ends_it():
    det = StallDetector(min_stall=2)
    run(det, [sample(1, 7)] * 5)
    assert det.stalled
    v = det.observe(sample(1, 8), 10.0)
    assert not v.stalled and v.new



def busy(progress, activity, first_token=None):
    """A vLLM sample with one request running: its token counter and its KV-cache usage."""
    return EngineSample("vllm", 1, 0.0, progress, progress, True, None, first_token, activity=activity)


def test_a_long_prefill_whose_kv_cache_grows_is_progress_even_while_a_process_spins():
    """Measured on vLLM 0.32 (CPU, 14 K-token prompt, --max-num-batched-tokens 512): prompt_tokens_total stays 0
    through the 26 s prefill while kv_cache_usage_perc rises at every 3 s scrape. The engine spins at 86 %."""
    det = StallDetector(stall_multiple=4, min_stall=10, max_stall=600)
    usage = [0.047, 0.086, 0.110, 0.133, 0.157, 0.172, 0.188, 0.204, 0.22]
    verdicts = [det.observe(busy(0, u), 3.0 * i, spinning=True) for i, u in enumerate(usage)]
    assert not any(v.stalled for v in verdicts)
    # then the engine hangs: nothing moves, and the spin rule's floor applies
    hung = [det.observe(busy(0, 0.22), 24.0 + 3.0 * i, spinning=True) for i in range(1, 5)]  # last move: 24 s
    assert [v.stalled for v in hung] == [False, False, False, True] and hung[3].threshold == 10


def test_a_gauge_that_does_not_move_is_no_progress_whatever_its_level():
    det = StallDetector(min_stall=3)
    assert [v.stalled for v in run(det, [busy(5, 0.5)] * 6)] == [False] * 4 + [True, True]


def test_an_engine_whose_steps_are_long_is_judged_on_them_not_on_the_floor():
    """One chunk every 20 s (a 186 K-token prefill on one card): a quiet look between movements is one step,
    and the floor rises to stall_multiple steps, spinning or not; a hang is still caught past it."""
    det = StallDetector(stall_multiple=4, min_stall=30, max_stall=1800)
    for chunk in range(6):
        for i in range(4):  # scrapes every 5 s; the KV cache grows once each 20 s
            det.observe(busy(0, 0.1 + 0.01 * chunk), 20.0 * chunk + 5.0 * i, spinning=True)
    assert det.floor == 80 and det.threshold(spinning=True) == 80
    last = 0.1 + 0.01 * 5
    assert not det.observe(busy(0, last), 175.0, spinning=True).stalled  # 75 s after the last chunk
    assert det.observe(busy(0, last), 185.0, spinning=True).stalled


def test_steps_are_learnt_only_from_quiet_looks_so_a_slow_scrape_is_no_step():
    det = StallDetector(stall_multiple=4, min_stall=5, max_stall=600)
    run(det, [busy(i, 0.1) for i in range(20)], step=10.0)  # moves at every look, 10 s apart
    assert det.floor == 5


def test_under_suspicion_the_floor_applies_where_progress_moves_each_step():
    det = StallDetector(stall_multiple=4, min_stall=5, max_stall=600)
    run(det, [busy(100 * i, None, first_token=(30.0 * i, i)) for i in range(1, 5)])  # prefills took 30 s
    assert det.threshold() == 120 and det.threshold(suspect=True) == 5
    verdicts = [det.observe(busy(400, None), 4.0 + i, suspect=True) for i in range(6)]  # last progress at t=3
    assert [v.stalled for v in verdicts] == [False] * 5 + [True] and verdicts[5].threshold == 5


def test_suspicion_does_not_shorten_a_counter_that_moves_only_as_requests_end():
    """A per-request counter proves nothing within a request's time: the canary watches such an engine."""
    det = StallDetector(stall_multiple=4, min_stall=5, max_stall=600)
    run(det, [sample(1, i, lat_sum=100.0 * i, lat_count=i) for i in range(1, 5)])
    assert det.threshold(suspect=True) == 400


def test_where_a_prefills_work_is_seen_the_time_to_a_first_token_no_longer_stretches_the_threshold():
    """vLLM's KV-cache usage shows every chunk of a prefill: a stopped EngineCore in a 30 s prefill is caught at
    the floor, not at 4 x 30 s."""
    det = StallDetector(stall_multiple=4, min_stall=5, max_stall=600)
    run(det, [busy(100 * i, 0.01 * i, first_token=(30.0 * i, i)) for i in range(1, 5)])
    assert det.typical is None and det.threshold() == 5
    blind = StallDetector(stall_multiple=4, min_stall=5, max_stall=600)
    run(blind, [busy(100 * i, None, first_token=(30.0 * i, i)) for i in range(1, 5)])
    assert blind.typical == 30 and blind.threshold() == 120


def test_a_stall_that_ended_is_not_learnt_as_a_step():
    det = StallDetector(stall_multiple=4, min_stall=5, max_stall=600)
    run(det, [busy(0, 0.1), busy(1, 0.1)] + [busy(1, 0.1)] * 100 + [busy(2, 0.1)])  # stalled 101 s, then moved
    assert det.floor == 5
    run(det, [busy(2, 0.1)] * 3 + [busy(3, 0.1)], start=103.0)  # a 4 s step, quiet looks between: learnt
    assert det.floor == 16


def test_due_is_when_the_threshold_runs_out_from_the_last_progress_seen():
    """The clock starts at the scrape that saw the last progress (never before it: a healthy engine is judged
    only on time it really went without progress); `due` says when a look would find the stall."""
    det = StallDetector(stall_multiple=4, min_stall=5, max_stall=60)
    run(det, [sample(1, 100), sample(1, 101)])  # progress seen at t=1
    assert det.due == 6.0
    assert det.observe(sample(1, 101), 3.0).stalled is False and det.due == 6.0  # nothing moved: still due at 6
    assert det.observe(sample(1, 101), 6.01).stalled  # a look just after `due` finds the stall
    assert det.due is None  # stalled: nothing more is due


def test_nothing_is_due_while_idle_or_moving_on():
    det = StallDetector(min_stall=5)
    det.observe(sample(0, 100), 0.0)
    assert det.due is None  # idle: no stall is coming
    det.observe(sample(1, 100), 1.0)
    det.observe(sample(1, 102), 2.0)
    assert det.due == 7.0  # it moved at 2: the clock starts again
    det.observe(sample(0, 102), 3.0)
    assert det.due is None


def test_the_next_look_comes_at_the_tick_or_just_after_the_threshold_runs_out():
    assert next_look(10.0, None, 8.0, 8.0) == 10.0  # nothing due: the regular tick
    assert next_look(10.0, 12.0, 8.0, 8.0) == 10.0  # due after the tick: the tick
    assert 9.0 < next_look(10.0, 9.0, 8.0, 8.0) < 9.1  # due before the tick: just after it runs out
    assert next_look(10.0, 7.0, 8.0, 8.0) == 10.0  # already past (that look's scrape failed): no look again and again
    assert 8.2 < next_look(10.0, 8.05, 8.0, 8.0) < 8.5  # not right after the last look: its CPU reading needs a window


def test_a_tick_just_before_the_threshold_runs_out_moves_to_just_after_it():
    """A 10 s threshold and a 2 s scrape: the threshold runs out a scrape's duration after a regular tick. A look
    at the tick saw no stall, and the early look then waited out the CPU reading's window after it (real vLLM:
    judged 0.3 s late). One look just after the threshold instead, the tick that much late."""
    assert 10.1 < next_look(10.0, 10.1, 8.0, 8.0) < 10.2
    assert next_look(10.0, 10.5, 8.0, 8.0) == 10.0  # far enough before it: the tick, then the early look


def test_a_look_dated_before_the_threshold_ran_out_but_ended_after_it_still_gets_its_early_look():
    """Its scrape answered before the threshold ran out (no stall in it); its process look ended after. Taken for
    a look past it, it left the stall to the next tick: judged a whole scrape late (12.0 s for a 10 s threshold,
    on a real vLLM)."""
    assert 10.2 < next_look(12.0, 10.0, 9.95, 10.2) < 10.5
    assert next_look(12.0, 10.0, 10.05, 10.2) == 12.0  # dated after it: that look judged it
