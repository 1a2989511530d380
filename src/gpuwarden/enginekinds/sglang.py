"""SGLang. Each choice below was checked against the engine's source; the comment says where."""

from __future__ import annotations

from gpuwarden.enginekinds.base import (
    NUM,
    PYTHON,
    Answer,
    CanaryApi,
    EngineKind,
    LineRule,
    LogProfile,
    Metrics,
    Progress,
    Send,
    histogram,
    line,
)

# A 503 from /health_generate that came this late is its own deadline passing (SGLANG_HEALTH_CHECK_TIMEOUT, 20 s
# unless set), not a server starting or stopping: those answer at once, and even a machine too busy to answer a
# 503 in well under 5 s must not pass a starting engine for a stuck one.
WAITED = 5.0
_PREFIX = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: [A-Z]{2}\d{1,5}){0,4}\] "  # "[date time TP0] ", "[... DP0 TP0] "


async def _complete(send: Send) -> Answer:
    """GET /health_generate, SGLang's own one-token generation (sglang/srt/entrypoints/http_server.py, checked at
    sgl-project/sglang@0025436e). It answers 200 as soon as the scheduler sends anything back (a busy engine's
    running batch counts, so it adds no load), and 503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) without a
    response; it also answers 503 at once while the server starts or shuts down. Older releases run the same
    generation with no deadline of their own, which the canary's deadline bounds. `/health` is not used: newer
    releases let SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false turn it into a plain liveness check, older ones
    always were."""
    return await send("GET", "/health_generate")


def _late(status: int, seconds: float) -> str | None:
    if status == 503 and seconds >= WAITED:
        return f"SGLang's own one-token generation (/health_generate) got no token back: HTTP 503 after {seconds:.0f} s"
    return None


KIND = EngineKind(
    "sglang", "SGLang",
    canary=CanaryApi("sglang", _complete, _late),
    metrics=Metrics(
        "sglang:",
        running=("sglang:num_running_reqs",),
        waiting=("sglang:num_queue_reqs",),
        generated=("sglang:generation_tokens_total",),
        # metrics/collector.py: realtime_tokens_total is added by the scheduler at each stats log (every
        # decode_log_interval steps and every prefill batch); the token totals are added by the tokenizer
        # manager when a request finishes.
        progress=(Progress(("sglang:realtime_tokens_total",), per_step=True),
                  Progress(("sglang:generation_tokens_total", "sglang:prompt_tokens_total"), per_step=False)),
        token_timing=(histogram("sglang:inter_token_latency_seconds"),
                      histogram("sglang:time_per_output_token_seconds")),
        first_token_timing=(histogram("sglang:time_to_first_token_seconds"),),
        request_timing=(histogram("sglang:e2e_request_latency_seconds"),),
        # the scheduler sets token_usage (KV pool in use) at each prefill batch's stats, chunks included
        activity=("sglang:token_usage",),
        spec_accepted=("sglang:spec_accept_length",),
    ),
    # sglang/srt/managers/scheduler_metrics_mixin.py (and scheduler.py before it): "Decode batch[ [n]],
    # #running-req: N, ... gen throughput (token/s): X" every decode_log_interval (40) decode steps
    # ("Decode batch. #running-req" before 2025), and "Prefill batch[...], #new-seq: N, #new-token: T, ...
    # #running-req: R" for every prefill batch.
    log=LogProfile(
        (LineRule(line(_PREFIX, rf"Decode batch(?: \[\d+\])?[.,] #running-req: (?P<running>\d+),.{{0,512}}?"
                       rf"gen throughput \(token/s\): (?P<gen>{NUM})"), running="set", tokens=("gen",)),
         LineRule(line(_PREFIX, r"Prefill batch(?: \[\d+\])?(?:\(mixed #running-req: \d+\))?[.,] #new-seq: "
                       r"(?P<new>\d+), #new-token: (?P<tokens>\d+),.{0,512}?#running-req: (?P<running>\d+)"),
                  running="set", tokens=("tokens",))),
        per_step=True, interval=0.0, knows_running=True),
    commands=("sglang.launch_server", "sglang serve"),
    executables=(PYTHON,),
    more="start it with --enable-metrics (or watch its log: source = \"log\")",
)
