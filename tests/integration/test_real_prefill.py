"""A long prefill is work, not a stall; a hang during one is still caught at the floor. Real engines (tests/peers:
vLLM's CPU build, llama.cpp's llama-server), random-weight models made big enough, and batches made small
enough, that a prefill takes many engine steps; the real daemon watches them. min_stall and the prompt are
sized from the engine's prefill rate measured first on this machine (tests/peers/sizing.py): min_stall well
above one engine step, the prefill several times min_stall, on a fast machine as on a slow one.

- vLLM counts a prompt's tokens only when its prefill completes; its KV-cache usage grows chunk by chunk.
- llama.cpp's n_decode_total counts every prompt batch.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import ClassVar

import pytest
from helpers import wait_for
from test_real_engines import BAD, engine, events, metric, wait_event

from peers.engines import TINY_LLAMA, LlamaCpp, Vllm
from peers.freezer import freeze_inside_a_decode
from peers.load import Load
from peers.sizing import TooFast, measured_rate, stall_floor, tokens_for

INTERVAL, MIN_STALL, GRACE = 2.0, 3.0, 5.0  # a scrape may take its whole interval (check: timeout <= interval)
# MIN_STALL is the least: a slow machine's steps raise it. A long prompt's prefill is sized to last PREFILL
# x min_stall here (at least 3 x is checked).
PREFILL = 5
PROBE = 1024  # tokens of the prompt that measures the rate: 4 chunks of vLLM's 256, 16 batches of llama.cpp's 64
VLLM_STEP, LLAMACPP_STEP = 256, 64  # prompt tokens an engine step takes in (the classes below)
VLLM_CONTEXT, LLAMACPP_CONTEXT = 32768, 16384  # room for a fast machine's prompt (KV cache: 768 and 512 MiB)

pytestmark = pytest.mark.root  # ptrace, and killing engine trees


class BigVllm(Vllm):
    """TINY_LLAMA made about six times the work per token, and chunks of 256 tokens (--max-num-batched-tokens):
    a long prompt's prefill takes many engine steps."""

    model: ClassVar[dict] = {**TINY_LLAMA, "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 6,
             "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 64,
             "max_position_embeddings": VLLM_CONTEXT}

    def command(self) -> list[str]:
        command = super().command()
        command[command.index("--max-model-len") + 1] = str(VLLM_CONTEXT)
        return [*command, "--max-num-batched-tokens", str(VLLM_STEP)]


class SmallBatchLlamaCpp(LlamaCpp):
    """The "slow" model (tests/peers) with prompt batches of 64 tokens (--batch-size, --ubatch-size)."""

    def command(self) -> list[str]:
        return [*super().command(), "-b", str(LLAMACPP_STEP), "-ub", str(LLAMACPP_STEP)]


@dataclass(frozen=True)
class Sized:
    min_stall: float
    prompt: int  # tokens
    step: float  # seconds an engine step of the prefill takes here


def sized_prefill(server, profile: str, step_tokens: int, context: int) -> Sized:
    """min_stall above one engine step and the prompt whose prefill lasts PREFILL x that on this machine, from
    the engine's rate (other seeds than the test's prompts: nothing of theirs is cached). Before the daemon
    starts: it sees none of this."""
    rate, how = measured_rate(server.url, "prefill", PROBE)
    min_stall = stall_floor(rate, step_tokens, least=MIN_STALL)
    try:
        prompt = tokens_for(rate, PREFILL * min_stall, least=PROBE, most=context - 16)
    except TooFast as exc:
        # The rate is a short prompt's; a long one costs more a token (attention over all that came before it:
        # a 30,000-token prompt sized for 15 s took 51 s here), so the longest prompt the context holds may
        # still last long enough. Its prefill's own time is checked (prefill_then_hang): too short, it fails
        # there, saying so (a machine faster than this 2,956-tokens/s one skipped, and a skip fails CI).
        prompt = context - 16
        print(f"{profile}: {exc}: the whole context instead, its prefill's time checked")
    # whole engine steps: llama.cpp's last prompt batch, when short of -b, costs ~57 ms a token on this CPU build
    # against ~7 for a whole one (after ~4,400 tokens: 16 tokens 1.1 s, 32 1.9 s, 47 2.7 s, 59 4.1 s, 63 3.6 s; a
    # whole last batch of 64 0.66 s, the others 0.4-0.5 s), longer than a min_stall sized on whole steps: a daemon
    # told that 3 s without progress is a stall killed the engine there (CI, stop 50)
    prompt -= prompt % step_tokens
    print(f"{profile}: {how}: min_stall {min_stall} s, a {prompt}-token prompt for {PREFILL * min_stall:.0f} s")
    return Sized(min_stall, prompt, step_tokens / rate)


def watched(daemon_factory, server, sized: Sized):
    d = daemon_factory(engine(server, scrape_interval=f'"{INTERVAL}s"', scrape_timeout=f'"{INTERVAL}s"',
                              min_stall=f'"{sized.min_stall}s"', kill_grace=f'"{GRACE}s"', canary='"off"')).start()
    d.wait_serving()
    return d


def prefill_then_hang(d, server, profile: str, sized: Sized, hang) -> None:
    """One long prompt's prefill, watched: it completes, never called stalled; then a second one is hung midway
    by `hang()` and must be caught within the threshold + one scrape + 2 s of the last progress."""
    prompt, min_stall = sized.prompt, sized.min_stall
    # the floor, or stall_multiple (4) x the longest step the engine was seen to take (a step between two quiet
    # looks: 8 s at most where a step takes a second, 3 steps where one takes longer)
    most = 4 * max(8.0, 3 * sized.step)
    with Load(server.url, streams=1, requests=1, prompt_tokens=prompt, max_tokens=2, timeout=900) as load:
        wait_for(lambda: load.results, 900, interval=0.5, what="the long prompt's completion")
    [result] = load.results
    assert result.ok, result
    print(f"{profile}: a {prompt}-token prefill took {result.seconds:.1f} s (min_stall {min_stall} s)")
    assert result.seconds >= 3 * min_stall, f"a {prompt}-token prefill took {result.seconds:.1f} s: too fast here " \
        f"to prove a long prefill is work (3 x min_stall {min_stall} s at least)"
    assert not events(d, BAD), events(d, BAD)
    with Load(server.url, streams=1, requests=1, prompt_tokens=prompt, max_tokens=2, timeout=900, seed=1):
        time.sleep(3 * INTERVAL)  # into the prefill (another prompt: none of it is cached)
        with hang():
            stopped_at = time.time()
            stall = wait_event(d, "engine_stall", timeout=most + 60)
            wait_event(d, "engine_killed", timeout=GRACE + 30)
    figures = stall["evidence"]["figures"]
    print(f"{profile}: stopped mid-prefill, called stalled {stall['time'] - stopped_at:.1f} s later "
          f"(threshold {figures['threshold_seconds']} s, scrape {INTERVAL} s)")
    assert figures["running"] >= 1 and not stall["evidence"]["spinning"], stall  # a stopped engine does not spin
    assert min_stall <= figures["threshold_seconds"] <= most
    # measured by the daemon from the last progress
    assert figures["stalled_seconds"] <= figures["threshold_seconds"] + INTERVAL + 2


def test_a_long_vllm_prefill_is_work_and_a_stopped_engine_core_in_one_is_killed(servers, daemon_factory):
    vllm = servers(BigVllm)
    d = watched(daemon_factory, vllm, sized := sized_prefill(vllm, "vLLM", VLLM_STEP, VLLM_CONTEXT))

    class EngineCoreStopped:
        def __enter__(self):
            assert metric(vllm, "vllm:kv_cache_usage_perc") > 0  # the prefill is under way
            os.kill(vllm.process("VLLM::EngineCore"), signal.SIGSTOP)

        def __exit__(self, *exc):
            pass  # the kill ends it (the fixture's stop sends SIGCONT first)

    prefill_then_hang(d, vllm, "vLLM", sized, EngineCoreStopped)
    wait_for(vllm.gone, GRACE + 10, what="the whole vLLM tree to be gone")
    assert d.stop() == 0


def test_a_long_llamacpp_prefill_is_work_and_a_frozen_inference_thread_in_one_is_killed(servers, daemon_factory):
    server = servers(SmallBatchLlamaCpp, model="slow", slots=1, context=LLAMACPP_CONTEXT)
    d = watched(daemon_factory, server, sized := sized_prefill(server, "llama.cpp", LLAMACPP_STEP, LLAMACPP_CONTEXT))

    class Frozen:
        def __enter__(self):
            self.freezer = freeze_inside_a_decode(server.proc.pid, server.metrics_url)

        def __exit__(self, *exc):
            self.freezer.thaw()

    prefill_then_hang(d, server, "llama.cpp", sized, Frozen)
    wait_for(server.gone, GRACE + 10, what="llama-server to be gone")
    assert d.stop() == 0
