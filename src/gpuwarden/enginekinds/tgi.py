"""Hugging Face text-generation-inference (TGI). Its log says nothing per step gpuwarden reads: /metrics only."""

from __future__ import annotations

from gpuwarden.enginekinds.base import EngineKind, Metrics, Progress, histogram
from gpuwarden.enginekinds.openai import OPENAI

KIND = EngineKind(
    "tgi", "TGI",
    canary=OPENAI,
    metrics=Metrics(
        "tgi_",
        running=("tgi_batch_current_size",),
        waiting=("tgi_queue_size",),
        generated=("tgi_request_generated_tokens_sum",),  # finished requests only
        # router: one tgi_batch_inference_count per prefill or decode step.
        progress=(Progress(("tgi_batch_inference_count",), per_step=True),
                  Progress(("tgi_request_generated_tokens_sum", "tgi_request_input_length_sum"), per_step=False)),
        token_timing=(histogram("tgi_request_mean_time_per_token_duration"),),
        request_timing=(histogram("tgi_request_duration"),),
    ),
    commands=("text-generation-launcher", "text-generation-server"),
    executables=(r"text-generation-(launcher|router|server)",),
    more="/metrics is on by default",
)
