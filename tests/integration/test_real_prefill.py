"""A long prefill is work, not a stall; a hang during one is still caught at the floor. Real engines (tests/peers:
vLLM's CPU build, llama.cpp's llama-server), random-weight models made big enough, and batches made small
enough, that a prefill takes many engine steps; the real daemon watches them. The prompt is sized from the
engine's prefill rate measured first on this machine (tests/peers/sizing.py), so that its prefill lasts
several times min_stall on a fast machine as on a slow one.

- vLLM counts a prompt's tokens only when its prefill completes; its KV-cache usage grows chunk by chunk.
- llama.cpp's n_decode_total counts every prompt batch.
"""

from __future__ import annotations

import os
import signal
import time
from typing import ClassVar

import pytest
from helpers import wait_for
from test_real_engines import BAD, engine, events, metric, wait_event

from peers.engines import TINY_LLAMA, LlamaCpp, Vllm
from peers.freezer import freeze_inside_a_decode
from peers.load import Load
from peers.sizing import TooFast, sized

INTERVAL, MIN_STALL, GRACE = 2.0, 3.0, 5.0  # a scrape may take its whole interval (check: timeout <= interval)
PREFILL = 5 * MIN_STALL  # seconds a long prompt's prefill is sized to last here (at least 3 x min_stall is checked)
PROBE = 1024  # tokens of the prompt that measures the rate: 4 chunks of vLLM's 256, 16 batches of llama.cpp's 64
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
        return [*command, "--max-num-batched-tokens", "256"]


class SmallBatchLlamaCpp(LlamaCpp):
    """The "slow" model (tests/peers) with prompt batches of 64 tokens (--batch-size, --ubatch-size)."""

    def command(self) -> list[str]:
        return [*super().command(), "-b", "64", "-ub", "64"]


def sized_prompt(server, profile: str, context: int) -> int:
    """The prompt whose prefill lasts PREFILL seconds on this machine, from the engine's rate (other seeds than
    the test's prompts: nothing of theirs is cached). Before the daemon starts: it sees none of this."""
    try:
        prompt, how = sized(server.url, "prefill", PREFILL, PROBE, context)
    except TooFast as exc:
        pytest.skip(f"{profile}: {exc}")  # says why; as root (CI) a skip fails the run
    print(f"{profile}: {how}")
    return prompt


def prefill_then_hang(d, server, profile: str, prompt: int, hang) -> None:
    """One long prompt's prefill, watched: it completes, never called stalled; then a second one is hung midway
    by `hang()` and must be caught within the threshold + one scrape + 2 s of the last progress."""
    with Load(server.url, streams=1, requests=1, prompt_tokens=prompt, max_tokens=2, timeout=600) as load:
        wait_for(lambda: load.results, 400, interval=0.5, what="the long prompt's completion")
    [result] = load.results
    assert result.ok, result
    print(f"{profile}: a {prompt}-token prefill took {result.seconds:.1f} s (min_stall {MIN_STALL} s)")
    assert result.seconds >= 3 * MIN_STALL  # the prefill really was long
    assert not events(d, BAD), events(d, BAD)
    with Load(server.url, streams=1, requests=1, prompt_tokens=prompt, max_tokens=2, timeout=600, seed=1):
        time.sleep(3 * INTERVAL)  # into the prefill (another prompt: none of it is cached)
        with hang():
            stopped_at = time.time()
            stall = wait_event(d, "engine_stall", timeout=MIN_STALL + 60)
            wait_event(d, "engine_killed", timeout=GRACE + 30)
    figures = stall["evidence"]["figures"]
    print(f"{profile}: stopped mid-prefill, called stalled {stall['time'] - stopped_at:.1f} s later "
          f"(threshold {figures['threshold_seconds']} s, scrape {INTERVAL} s)")
    assert figures["running"] >= 1 and not stall["evidence"]["spinning"]  # a stopped engine does not spin
    # the floor, or stall_multiple x the longest step the engine was seen to take (a chunk between two quiet looks)
    assert MIN_STALL <= figures["threshold_seconds"] <= 4 * 8.0
    # measured by the daemon from the last progress
    assert figures["stalled_seconds"] <= figures["threshold_seconds"] + INTERVAL + 2


def test_a_long_vllm_prefill_is_work_and_a_stopped_engine_core_in_one_is_killed(servers, daemon_factory):
    vllm = servers(BigVllm)
    prompt = sized_prompt(vllm, "vLLM", VLLM_CONTEXT)
    d = daemon_factory(engine(vllm, scrape_interval=f'"{INTERVAL}s"', scrape_timeout=f'"{INTERVAL}s"',
                              min_stall=f'"{MIN_STALL}s"',
                              kill_grace=f'"{GRACE}s"', canary='"off"')).start()
    d.wait_serving()

    class EngineCoreStopped:
        def __enter__(self):
            assert metric(vllm, "vllm:kv_cache_usage_perc") > 0  # the prefill is under way
            os.kill(vllm.process("VLLM::EngineCore"), signal.SIGSTOP)

        def __exit__(self, *exc):
            pass  # the kill ends it (the fixture's stop sends SIGCONT first)

    prefill_then_hang(d, vllm, "vLLM", prompt, EngineCoreStopped)
    wait_for(vllm.gone, GRACE + 10, what="the whole vLLM tree to be gone")
    assert d.stop() == 0


def test_a_long_llamacpp_prefill_is_work_and_a_frozen_inference_thread_in_one_is_killed(servers, daemon_factory):
    server = servers(SmallBatchLlamaCpp, model="slow", slots=1, context=LLAMACPP_CONTEXT)
    prompt = sized_prompt(server, "llama.cpp", LLAMACPP_CONTEXT)
    d = daemon_factory(engine(server, scrape_interval=f'"{INTERVAL}s"', scrape_timeout=f'"{INTERVAL}s"',
                              min_stall=f'"{MIN_STALL}s"',
                              kill_grace=f'"{GRACE}s"', canary='"off"')).start()
    d.wait_serving()

    class Frozen:
        def __enter__(self):
            self.freezer = freeze_inside_a_decode(server.proc.pid, server.metrics_url)

        def __exit__(self, *exc):
            self.freezer.thaw()

    prefill_then_hang(d, server, "llama.cpp", prompt, Frozen)
    wait_for(server.gone, GRACE + 10, what="llama-server to be gone")
    assert d.stop() == 0
