"""The workload of a test that needs some seconds of an engine's work, sized from the engine's measured rate
(tests/peers/sizing.py): the same seconds on a fast machine and a slow one."""

import pytest

from peers.sizing import TooFast, rate, stall_floor, tokens_for

SECONDS = 15.0  # 5 x a min_stall of 3 s


def test_a_fast_engine_gets_a_longer_prompt_and_a_slow_one_a_shorter_for_the_same_seconds():
    fast = rate(16, 0.05, 1024, 0.9)  # the machine where a fixed 7,000-token prompt took 6 s
    slow = rate(16, 0.3, 1024, 5.0)
    assert fast == pytest.approx(1185.9, abs=0.1) and slow == pytest.approx(214.5, abs=0.1)
    assert tokens_for(fast, SECONDS, least=1024, most=32768) == 17789
    assert tokens_for(slow, SECONDS, least=1024, most=32768) == 3218
    for measured in (fast, slow):
        assert tokens_for(measured, SECONDS, least=1024, most=32768) / measured >= SECONDS


def test_min_stall_stays_above_an_engine_step_on_a_slow_machine():
    """256-token chunks: 0.2 s each at 1,186 tokens/s (the floor of 3 s stands), 5.8 s each at 44 tokens/s (a
    loaded 2-core box, where a 3 s floor called the first chunk a stall): 3 x that."""
    assert stall_floor(1185.9, 256, least=3.0) == 3.0
    assert stall_floor(44.0, 256, least=3.0) == 17.5
    assert stall_floor(44.0, 64, least=3.0) == 4.4
    with pytest.raises(ValueError, match="a rate"):
        stall_floor(0.0, 256, least=3.0)


def test_the_request_overhead_is_not_taken_for_the_engines_work():
    """A fast engine's 1,024-token prompt in 0.9 s, of which 0.5 s is what any request costs: the rate is that
    of the 1,008 tokens more, not 1,024 tokens over 0.9 s (which would size a prompt too short)."""
    assert rate(16, 0.5, 1024, 0.9) == pytest.approx(2520)


def test_a_very_slow_engine_still_gets_the_least_work():
    assert tokens_for(20.0, SECONDS, least=1024, most=32768) == 1024


def test_an_engine_too_fast_for_its_context_says_so():
    with pytest.raises(TooFast, match=r"this engine's decode runs at 5000 tokens/s: 15 s of it needs 75000 "
                                      r"tokens, more than its context holds \(32768\)"):
        tokens_for(5000.0, SECONDS, least=1024, most=32768, what="decode")


@pytest.mark.parametrize(("timings", "said"), [
    ((16, 1.0, 1024, 0.8), "1024 tokens took 0.80 s, no longer than 16 (1.00 s): no rate to measure"),
    ((1024, 1.0, 16, 2.0), "the long request (16 tokens) must have more than the short (1024)"),
])
def test_a_measurement_that_shows_no_rate_is_refused(timings, said):
    with pytest.raises(ValueError, match=said.replace("(", r"\(").replace(")", r"\)")):
        rate(*timings)
