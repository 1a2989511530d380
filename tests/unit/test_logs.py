"""Log profiles on real lines of each engine (tests/corpus/logs, with their sources), and the log reader and
/slots progress, pure."""

from pathlib import Path

import pytest

from gpuwarden.engine.logs import FileLines, LogReader
from gpuwarden.engine.slots import SlotsProgress
from gpuwarden.engine.stall import StallDetector


def lines(corpus: Path, name: str) -> list[str]:
    return (corpus / "logs" / name).read_text().splitlines()


def after_each(profile: str, text: list[str]) -> list[tuple]:
    """(running, progress) after each line."""
    reader, out = LogReader(profile), []
    for line in text:
        reader.feed(line)
        s = reader.sample()
        out.append((s.running, s.progress))
    return out


def test_vllm_lines_v0_and_v1(corpus):
    assert after_each("vllm", lines(corpus, "vllm.log")) == [
        (1, 1),  # V0, 41.7 tokens/s
        (19, 2),  # V1 "Engine 000:": 18 running, counted apart from V0's engine-less line
        (19, 2), (19, 2),  # access log and SpecDecoding lines: not progress lines
        (19, 2),  # 0.0 tokens/s with 1 running: no progress
        (18, 2),  # idle
    ]


def test_sglang_decode_and_prefill_lines(corpus):
    assert after_each("sglang", lines(corpus, "sglang.log")) == [
        (8, 1), (509, 2), (5, 3), (5, 3),  # decode lines, old and new form; an access line
        (32, 4),  # a prefill batch of 1 new sequence beside 31 running
    ]


def test_llamacpp_slot_lines(corpus):
    reader = LogReader("llamacpp")
    got = []
    for line in lines(corpus, "llamacpp.log"):
        reader.feed(line)
        got.append((reader.sample().running, reader.sample().progress))
    assert got == [(1, 1), (1, 1), (1, 2), (1, 3), (1, 3), (1, 3), (0, 4), (0, 4), (0, 4)]
    assert reader.sample().timing == pytest.approx((5.41305 + 0.18874, 2))  # two requests' total times
    assert reader.sample().per_step is False


def test_ollama_counts_finished_completions_only_and_knows_nothing_running(corpus):
    got = after_each("ollama", lines(corpus, "ollama.log"))
    assert [p for _, p in got] == [1, 1, 1, 1, 1]  # 200 generate; /api/ps, 403, 500 and start-up are not
    assert {r for r, _ in got} == {None}


def test_auto_picks_the_engine_of_the_first_line_it_knows_and_ignores_the_rest(corpus):
    reader = LogReader("auto")
    assert reader.sample().progress is None  # nothing known yet: no judgement
    for line in ["some banner", *lines(corpus, "sglang.log")]:
        reader.feed(line)
    assert reader.sample().profile == "sglang log" and reader.lines == 4
    reader.feed(lines(corpus, "vllm.log")[1])  # another engine's line: ignored, never guessed
    assert reader.lines == 4


def test_a_vllm_stall_is_one_zero_line_then_silence_and_the_detector_sees_it():
    """V1 logs a 0.0 line once, then drops to DEBUG: silence after it, with requests running, is the stall."""
    reader, detector = LogReader("vllm"), StallDetector(min_stall=20)
    busy = ("Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: {} tokens/s, "
            "Running: 8 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%")
    for t in range(0, 60, 10):
        reader.feed(busy.format("312.5"))
        assert not detector.observe(reader.sample(), t).stalled
    reader.feed(busy.format("0.0"))
    verdicts = [detector.observe(reader.sample(), t) for t in range(60, 90, 2)]
    assert not verdicts[0].stalled and verdicts[-1].stalled  # silence past the threshold


def test_file_lines_follow_appends_rotation_and_truncation(tmp_path):
    path = tmp_path / "engine.log"
    path.write_text("old line\n")
    lines = FileLines(path)
    assert lines.read() == []  # only what comes from now on
    with path.open("a") as f:
        f.write("one\ntw")
    assert lines.read() == ["one"]
    with path.open("a") as f:
        f.write("o\n")
    assert lines.read() == ["two"]
    path.rename(tmp_path / "engine.log.1")
    path.write_text("new file\n")
    assert lines.read() == ["new file"]
    path.write_text("")
    path.write_text("cut\n")
    assert lines.read() == ["cut"]


def slot(id_, task, processing, decoded, prompt=16):
    return {"id": id_, "id_task": task, "is_processing": processing, "n_prompt_tokens_processed": prompt,
            "next_token": [{"n_decoded": decoded}]}


def test_slots_progress_only_grows_across_tasks_and_idle_slots():
    p = SlotsProgress()
    assert p.sample([slot(0, 7, True, 10), {"id": 1, "is_processing": False}]).progress == 26
    s = p.sample([slot(0, 7, True, 50), slot(1, 9, True, 1)])
    assert (s.running, s.progress) == (2, 26 + 40 + 17)
    s = p.sample([slot(0, 7, False, 0, prompt=0), slot(1, 9, True, 1)])  # released: its stats reset
    assert (s.running, s.progress) == (1, 83)
    assert p.sample([slot(0, 8, True, 3), slot(1, 9, True, 1)]).progress == 83 + 19


def test_a_log_that_cannot_be_read_is_a_failed_look_not_a_failed_start(tmp_path):
    import asyncio

    from gpuwarden.engine.logs import LogScraper
    from gpuwarden.engine.scraper import ScrapeError

    scraper = LogScraper.of(tmp_path / "missing.log", None, "vllm")
    with pytest.raises(ScrapeError, match=r"missing\.log"):
        asyncio.run(scraper.scrape())
    (tmp_path / "missing.log").write_text("")
    assert asyncio.run(scraper.scrape()).running is None  # nothing said yet: no judgement
