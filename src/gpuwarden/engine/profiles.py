"""What each engine's /metrics names mean, as data.

Each field lists metric sample names; the first family present wins, and all its series (one per model,
engine index or label set) are summed. `progress` is the counter that moves while tokens are generated.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    prefix: str  # every metric of this engine starts with it: how `auto` recognises the engine
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    generated: tuple[str, ...]  # counter of generated tokens
    prompt: tuple[str, ...]
    latency: str | None  # end-to-end request latency histogram (family name, without _sum/_count)
    spec_accepted: tuple[str, ...] = ()
    spec_draft: tuple[str, ...] = ()
    progress: tuple[str, ...] = ()  # the counter that proves forward progress; default `generated`
    commands: tuple[str, ...] = ()  # substrings of a server's command line, for discovery

    @property
    def progress_names(self) -> tuple[str, ...]:
        return self.progress or self.generated

    def names(self) -> set[str]:
        hist = {f"{self.latency}_sum", f"{self.latency}_count"} if self.latency else set()
        return {*self.running, *self.waiting, *self.generated, *self.prompt, *self.spec_accepted,
                *self.spec_draft, *self.progress, *hist}


PROFILES: tuple[Profile, ...] = (
    Profile(
        "vllm", "vllm:",
        # V0 and V1 share these names; V1 adds an `engine` label and `_created` series.
        running=("vllm:num_requests_running",),
        waiting=("vllm:num_requests_waiting",),
        generated=("vllm:generation_tokens_total",),
        prompt=("vllm:prompt_tokens_total",),
        latency="vllm:e2e_request_latency_seconds",
        spec_accepted=("vllm:spec_decode_num_accepted_tokens_total",),
        spec_draft=("vllm:spec_decode_num_draft_tokens_total",),
        commands=("vllm serve", "vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"),
    ),
    Profile(
        "sglang", "sglang:",
        running=("sglang:num_running_reqs",),
        waiting=("sglang:num_queue_reqs",),
        generated=("sglang:generation_tokens_total",),
        prompt=("sglang:prompt_tokens_total",),
        latency="sglang:e2e_request_latency_seconds",
        spec_accepted=("sglang:spec_accept_length",),
        commands=("sglang.launch_server", "sglang serve"),
    ),
    Profile(
        "llamacpp", "llamacpp:",
        running=("llamacpp:requests_processing",),
        waiting=("llamacpp:requests_deferred",),
        generated=("llamacpp:tokens_predicted_total",),
        prompt=("llamacpp:prompt_tokens_total",),
        latency=None,
        commands=("llama-server", "llama.cpp/server"),
    ),
    Profile(
        "tgi", "tgi_",
        running=("tgi_batch_current_size",),
        waiting=("tgi_queue_size",),
        generated=("tgi_request_generated_tokens_sum",),  # finished requests only
        prompt=("tgi_request_input_length_sum",),
        latency="tgi_request_duration",
        progress=("tgi_batch_inference_count",),  # one per prefill/decode step: moves while generating
        commands=("text-generation-launcher", "text-generation-server"),
    ),
)

BY_NAME = {p.name: p for p in PROFILES}
