"""What each engine's /metrics names mean, as data.

Gauges and counters list sample names: the first family present wins, and all its series (one per model,
engine index or label set) are summed. Progress and timing list alternatives, newest engine versions first.

Progress is any token processed (prompt or generated): a long prefill is progress too. Where no counter moves
during a (chunked) prefill, `activity` names the gauge that does: the KV cache the engine fills step by step.
Its changing is progress; its level means nothing. A counter that moves
on every engine step (`per_step`) proves progress within a step's time; one that moves only when a request
ends proves it only within a request's time, so the stall threshold follows the matching timing: seconds per
token for a per-step counter (and the time to a first token, where an engine counts a prefill only once it
is done), seconds per request otherwise. Each choice below was checked against the engine's source; the
comment says where.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Progress:
    names: tuple[str, ...]  # counters summed: tokens (or steps) processed
    per_step: bool  # True: moves on every engine step; False: only when a request ends


@dataclass(frozen=True, slots=True)
class Timing:
    sum: str  # seconds
    count: str  # tokens or requests


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    prefix: str  # every metric of this engine starts with it: how `auto` recognises the engine
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    generated: tuple[str, ...]  # counter of generated tokens (shown and exported; not the stall signal)
    progress: tuple[Progress, ...]  # the first whose names are present is the stall signal
    token_timing: tuple[Timing, ...] = ()  # seconds per generated token
    first_token_timing: tuple[Timing, ...] = ()  # seconds to a first token: how long a prefill may take
    request_timing: tuple[Timing, ...] = ()  # seconds per finished request
    activity: tuple[str, ...] = ()  # a gauge that changes on every step that does work (first present wins)
    spec_accepted: tuple[str, ...] = ()
    spec_draft: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()  # substrings of a server's command line, for discovery

    def names(self) -> set[str]:
        timings = (*self.token_timing, *self.first_token_timing, *self.request_timing)
        return {*self.running, *self.waiting, *self.generated, *self.spec_accepted, *self.spec_draft, *self.activity,
                *(n for p in self.progress for n in p.names), *(t.sum for t in timings),
                *(t.count for t in timings)}


def _histogram(family: str) -> Timing:
    return Timing(f"{family}_sum", f"{family}_count")


PROFILES: tuple[Profile, ...] = (
    Profile(
        "vllm", "vllm:",
        # V0 and V1 share these names; V1 adds an `engine` label and `_created` series.
        running=("vllm:num_requests_running",),
        waiting=("vllm:num_requests_waiting",),
        generated=("vllm:generation_tokens_total",),
        # V1 (v1/metrics/stats.py, loggers.py) adds each step's IterationStats: the tokens generated in that
        # step, and a request's prompt tokens when its (chunked) prefill completes with its first token.
        progress=(Progress(("vllm:generation_tokens_total", "vllm:prompt_tokens_total"), per_step=True),),
        token_timing=(_histogram("vllm:inter_token_latency_seconds"),  # V1 >= 0.10
                      _histogram("vllm:time_per_output_token_seconds")),
        first_token_timing=(_histogram("vllm:time_to_first_token_seconds"),),
        request_timing=(_histogram("vllm:e2e_request_latency_seconds"),),
        # v1/metrics/loggers.py: prompt_tokens_total moves only when a prefill completes (IterationStats counts
        # a request's prompt with its first token); kv_cache_usage_perc is set from the scheduler's stats after
        # every step, and a chunked prefill allocates blocks chunk by chunk (0.32, measured: 0.047, 0.086,
        # 0.110 ... every 3 s of a 14 K-token prefill). gpu_cache_usage_perc: its name before 0.10.
        activity=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        spec_accepted=("vllm:spec_decode_num_accepted_tokens_total",),
        spec_draft=("vllm:spec_decode_num_draft_tokens_total",),
        commands=("vllm serve", "vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"),
    ),
    Profile(
        "sglang", "sglang:",
        running=("sglang:num_running_reqs",),
        waiting=("sglang:num_queue_reqs",),
        generated=("sglang:generation_tokens_total",),
        # metrics/collector.py: realtime_tokens_total is added by the scheduler at each stats log (every
        # decode_log_interval steps and every prefill batch); the token totals are added by the tokenizer
        # manager when a request finishes.
        progress=(Progress(("sglang:realtime_tokens_total",), per_step=True),
                  Progress(("sglang:generation_tokens_total", "sglang:prompt_tokens_total"), per_step=False)),
        token_timing=(_histogram("sglang:inter_token_latency_seconds"),
                      _histogram("sglang:time_per_output_token_seconds")),
        first_token_timing=(_histogram("sglang:time_to_first_token_seconds"),),
        request_timing=(_histogram("sglang:e2e_request_latency_seconds"),),
        # the scheduler sets token_usage (KV pool in use) at each prefill batch's stats, chunks included
        activity=("sglang:token_usage",),
        spec_accepted=("sglang:spec_accept_length",),
        commands=("sglang.launch_server", "sglang serve"),
    ),
    Profile(
        "llamacpp", "llamacpp:",
        running=("llamacpp:requests_processing",),
        waiting=("llamacpp:requests_deferred",),
        generated=("llamacpp:tokens_predicted_total",),
        # tools/server: n_decode_total counts llama_decode calls (prompt batches and generation steps: measured
        # on b11434, a 3000-token prompt at --batch-size 64 moved it every 2 s while prompt_tokens_total stayed
        # 0); tokens_predicted_total and its seconds are added when a slot is released (a request ends).
        progress=(Progress(("llamacpp:n_decode_total",), per_step=True),
                  Progress(("llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_total"), per_step=False)),
        token_timing=(Timing("llamacpp:tokens_predicted_seconds_total", "llamacpp:tokens_predicted_total"),),
        commands=("llama-server", "llama.cpp/server"),
    ),
    Profile(
        "tgi", "tgi_",
        running=("tgi_batch_current_size",),
        waiting=("tgi_queue_size",),
        generated=("tgi_request_generated_tokens_sum",),  # finished requests only
        # router: one tgi_batch_inference_count per prefill or decode step.
        progress=(Progress(("tgi_batch_inference_count",), per_step=True),
                  Progress(("tgi_request_generated_tokens_sum", "tgi_request_input_length_sum"), per_step=False)),
        token_timing=(_histogram("tgi_request_mean_time_per_token_duration"),),
        request_timing=(_histogram("tgi_request_duration"),),
        commands=("text-generation-launcher", "text-generation-server"),
    ),
)

BY_NAME = {p.name: p for p in PROFILES}
