"""engine_not_answering's bound, pure: one page per silence past the bound, counted from the watch's start or
the last answer; its end said once it answers; a start the lifecycle times is not counted twice."""

from gpuwarden.engine.answering import Answering, Said, where


def test_a_silence_past_the_bound_is_said_once_and_its_end_when_it_answers():
    a = Answering(10.0, None)
    assert [a.observe(False, t, False) for t in (0.0, 5.0, 9.9)] == [None, None, None]
    assert a.observe(False, 10.0, False) is Said.NOT_ANSWERING and a.silent_for(10.0) == 10.0
    assert [a.observe(False, t, False) for t in (20.0, 500.0)] == [None, None]  # once per silence
    assert a.observe(True, 501.0, False) is Said.ANSWERS
    assert a.observe(True, 502.0, False) is None


def test_after_a_loss_the_bound_counts_from_the_first_silent_look_and_a_short_one_says_nothing():
    a = Answering(10.0, None)
    a.observe(True, 0.0, False)
    assert [a.observe(False, t, False) for t in (100.0, 105.0)] == [None, None]
    assert a.observe(True, 106.0, False) is None  # silent 6 s: no page, and no all-clear for one
    assert a.observe(False, 200.0, False) is None and a.began == "its last answer"
    assert a.observe(False, 210.0, False) is Said.NOT_ANSWERING


def test_a_start_the_lifecycle_times_is_left_to_it():
    a = Answering(10.0, None)
    assert [a.observe(False, t, True) for t in (0.0, 50.0, 100.0)] == [None, None, None]  # its deadline pages
    assert a.observe(False, 105.0, False) is None and a.observe(False, 110.0, False) is Said.NOT_ANSWERING


def test_the_address_said_holds_no_secret():
    assert where("http://user:s3cret@10.0.0.5:8000/metrics?token=x") == "http://10.0.0.5:8000/metrics"
    assert where("http://[::1]:8000/metrics") == "http://[::1]:8000/metrics"
