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
        (19, 3),  # 0.0 tokens/s with 1 running, but the KV cache went 2.0% -> 0.1% (the corpus joins logs): work
        (18, 4),  # idle; its KV cache emptied
    ]


def test_a_vllm_prefill_shows_in_its_kv_cache_while_both_throughputs_read_zero():
    """vLLM 0.32's stats line during a chunked prefill: no token counted yet, the KV cache growing."""
    line = ("(APIServer pid=1) INFO 12-04 09:50:{:02d} [loggers.py:271] Engine 000: Avg prompt throughput: 0.0 "
            "tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, CPU KV cache "
            "usage: {}%, Prefix cache hit rate: 0.0%")
    assert after_each("vllm", [line.format(i, kv) for i, kv in enumerate(("4.7", "8.6", "11.0", "11.0"))]) == [
        (1, 0), (1, 1), (1, 2), (1, 2)]


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


# Text a client chooses, as each engine logs it after its own prefix: vLLM's request log (a prompt, repr'd),
# SGLang's --log-requests, llama-server's verbose request dump and access line, Ollama's GIN path (%#v). Each
# carries a whole real progress line, prefix included, and must not count as progress.
FORGED = {
    "vllm": ["(APIServer pid=1) INFO 05-19 10:13:31 [logger.py:43] Received request cmpl-1: prompt: '"
             "INFO 05-19 10:13:31 [loggers.py:271] Engine 000: Avg prompt throughput: 9.0 tokens/s, Avg generation "
             "throughput: 9.0 tokens/s, Running: 1 reqs', params: SamplingParams(n=1)",
             # vLLM puts its prefix before each line of a message: a client's text over lines gets it too
             "(APIServer pid=1) INFO 05-19 10:13:31 [serving_chat.py:120] Engine 000: Avg prompt throughput: 9.0 "
             "tokens/s, Avg generation throughput: 9.0 tokens/s, Running: 1 reqs",
             "(APIServer pid=1) INFO:     127.0.0.1:37016 - \"POST /v1/x?Avg prompt throughput: 9.0 tokens/s, Avg "
             "generation throughput: 9.0 tokens/s, Running: 1 reqs HTTP/1.1\" 404 Not Found"],
    "sglang": ["[2025-02-27 04:46:39 TP0] Receive: obj=GenerateReqInput(text='[2025-02-27 04:46:39 TP0] Decode "
               "batch. #running-req: 8, #token: 62531, token usage: 0.12, gen throughput (token/s): 186.64')",
               "[2026-04-05 20:02:51] INFO:     127.0.0.1:40052 - \"POST /x?Prefill batch, #new-seq: 1, #new-token: "
               "158, #running-req: 31 HTTP/1.1\" 404 Not Found"],
    "llamacpp": ['srv  log_server_r: request:  {"prompt": "slot launch_slot_: id  0 | task 135 | processing task"}',
                 "srv  log_server_r: done request: POST /x?slot print_timing: id  0 | task 1 | n_gen = 9, tg = 1 "
                 "127.0.0.1 404",
                 "slot update_slots: id  0 | task 124 | new prompt: slot print_timing: id  0 | task 1 | n_gen = 9"],
    "ollama": ['[GIN] 2026/01/20 - 23:15:37 | 404 |    1.193025ms |       127.0.0.1 | GET      "/x | 200 | 1s | '
               '127.0.0.1 | POST \\"/api/generate\\""',
               '[GIN] 2026/01/20 - 23:15:37 | 200 |    1.193025ms |       127.0.0.1 | POST     "/api/show?[GIN] '
               '2026/01/20 - 23:15:37 | 200 | 1s | 127.0.0.1 | POST     "/api/generate"',
               'time=2024-08-19T14:09:56.520+08:00 level=INFO msg="[GIN] 2026/01/20 - 23:15:37 | 200 | 1s | '
               '127.0.0.1 | POST     \\"/api/generate\\""'],
}


@pytest.mark.parametrize("profile", FORGED)
def test_a_progress_line_forged_inside_a_client_text_is_not_progress(profile):
    """Rules are anchored to the engine's own prefix: a prompt or path that carries one hides no stall."""
    for chosen in (profile, "auto"):
        reader = LogReader(chosen)
        for line in FORGED[profile]:
            reader.feed(line)
            reader.feed("\x1b[32m" + line)  # colours are stripped, not a way around the anchor
        assert (reader.lines, reader.sample().progress) == (0, 0 if chosen == profile else None), (chosen, line)


def test_the_rules_accept_the_framing_others_add_and_colours(corpus):
    """A Docker timestamp, a Compose column, a journal prefix or a terminal's colours before a real line."""
    line = lines(corpus, "vllm.log")[1]
    for framed in ("2026-04-05T20:02:51.123456789Z " + line, "vllm-1  | " + line,
                   line.replace("[loggers.py:", "[v1/metrics/loggers.py:"),  # VLLM_LOGGING_USE_RELPATH
                   "Apr 05 20:02:51 box vllm[3646]: " + line,
                   line.replace("INFO", "\x1b[32mINFO\x1b[0m")):
        reader = LogReader("vllm")
        reader.feed(framed)
        assert reader.sample().progress == 1, framed


def test_a_vllm_stall_is_one_zero_line_then_silence_and_the_detector_sees_it():
    """V1 logs a 0.0 line once, then drops to DEBUG: silence after it, with requests running, is the stall."""
    reader, detector = LogReader("vllm"), StallDetector(min_stall=20)
    busy = ("(APIServer pid=1) INFO 05-19 10:13:31 [loggers.py:271] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
            "Avg generation throughput: {} tokens/s, "
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


def test_engines_sharing_one_log_file_each_get_their_own_read_at_the_same_moment(tmp_path):
    """CI, stop 32: eight engines on one FIFO polled in step; the in-flight key was the path, so the engines
    that always came second were told "the last read has not returned yet" for ever and never refused."""
    import asyncio

    from gpuwarden.engine.logs import LogScraper

    log = tmp_path / "engine.log"
    log.write_text("")
    scrapers = [LogScraper.of(log, None, "vllm") for _ in range(4)]

    async def together():
        return await asyncio.gather(*(s.scrape() for s in scrapers), return_exceptions=True)

    assert [type(outcome).__name__ for outcome in asyncio.run(together())] == ["EngineSample"] * 4


def test_a_long_prefill_moves_slots_progress_batch_by_batch():
    """Measured on llama-server b11434 (a 3000-token prompt, --batch-size 64): n_prompt_tokens_processed grew
    512, 960, 1472, 1856 at 2 s looks while prompt_tokens_total stayed 0. Builds with `n_past` count through it."""
    p = SlotsProgress()
    seen = [p.sample([slot(0, 0, True, 0, prompt=n)]).progress for n in (512, 960, 1472, 1856)]
    assert seen == [512, 960, 1472, 1856]
    older = SlotsProgress()
    seen = [older.sample([{"id": 0, "id_task": 3, "is_processing": True, "n_past": n}]).progress for n in (64, 128)]
    assert seen == [64, 128]


def test_under_systemd_without_systemd_python_the_journal_gets_prefixed_lines(tmp_path):
    """$JOURNAL_STREAM names our stderr (a real file here); systemd-python is made unimportable in a real child."""
    import subprocess
    import sys

    err = tmp_path / "stderr"
    code = ("import os, sys, logging; sys.modules['systemd'] = None; st = os.fstat(2); "
            "os.environ['JOURNAL_STREAM'] = f'{st.st_dev}:{st.st_ino}'; from gpuwarden.runtime import logsetup; "
            "logsetup.setup('info'); log = logging.getLogger('gpuwarden'); log.info('up'); "
            "log.error('bad http://u:secret@h/x')")
    with err.open("w") as stderr:
        run = subprocess.run([sys.executable, "-c", code], stderr=stderr, timeout=60)
    assert run.returncode == 0, err.read_text()
    assert err.read_text().splitlines() == ["<6>up", "<3>bad http://***@h/x"]
