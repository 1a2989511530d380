"""vLLM. Each choice below was checked against the engine's source; the comment says where."""

from __future__ import annotations

from gpuwarden.enginekinds.base import NUM, PYTHON, EngineKind, LineRule, LogProfile, Metrics, Progress, histogram, line
from gpuwarden.enginekinds.openai import OPENAI

# vllm/logger.py's format, from the stats loggers' own files only: vLLM repeats the whole prefix on every line
# of a multi-line message, so a client's text split over lines carries it too, with another file's name
_PREFIX = (r"(?:INFO|DEBUG) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})? \[?(?:[\w.-]{1,64}/){0,6}"
           r"(?:loggers|metrics|llm_engine)\.py:\d{1,5}\] ")

KIND = EngineKind(
    "vllm", "vLLM",
    canary=OPENAI,
    metrics=Metrics(
        "vllm:",
        # V0 and V1 share these names; V1 adds an `engine` label and `_created` series.
        running=("vllm:num_requests_running",),
        waiting=("vllm:num_requests_waiting",),
        generated=("vllm:generation_tokens_total",),
        # V1 (v1/metrics/stats.py, loggers.py) adds each step's IterationStats: the tokens generated in that
        # step, and a request's prompt tokens when its (chunked) prefill completes with its first token.
        progress=(Progress(("vllm:generation_tokens_total", "vllm:prompt_tokens_total"), per_step=True),),
        token_timing=(histogram("vllm:inter_token_latency_seconds"),  # V1 >= 0.10
                      histogram("vllm:time_per_output_token_seconds")),
        first_token_timing=(histogram("vllm:time_to_first_token_seconds"),),
        request_timing=(histogram("vllm:e2e_request_latency_seconds"),),
        # v1/metrics/loggers.py: prompt_tokens_total moves only when a prefill completes (IterationStats counts
        # a request's prompt with its first token); kv_cache_usage_perc is set from the scheduler's stats after
        # every step, and a chunked prefill allocates blocks chunk by chunk (0.32, measured: 0.047, 0.086,
        # 0.110 ... every 3 s of a 14 K-token prefill). gpu_cache_usage_perc: its name before 0.10.
        activity=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        spec_accepted=("vllm:spec_decode_num_accepted_tokens_total",),
        spec_draft=("vllm:spec_decode_num_draft_tokens_total",),
    ),
    # vllm/v1/metrics/loggers.py LoggingStatLogger.log (0.32.0, and V0's engine/metrics.py since 0.2):
    # "[Engine 000: ]Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s,
    # Running: %d reqs, ...", every VLLM_LOG_STATS_INTERVAL (10 s; 5 s in V0). V1 logs it at DEBUG once
    # this and the last interval both read 0 tokens/s: a stall shows as one 0.0 line, then silence.
    # The "KV cache usage" that follows grows chunk by chunk through a prefill whose tokens count only once it
    # is done: its change is progress while both throughputs read 0.0.
    log=LogProfile(
        (LineRule(line(_PREFIX, rf"(?:Engine (?P<key>\d+): )?Avg prompt throughput: (?P<prompt>{NUM}) tokens/s, "
                       rf"Avg generation throughput: (?P<gen>{NUM}) tokens/s, Running: (?P<running>\d+) reqs"
                       rf"(?:.{{0,256}}? KV cache usage: (?P<kv>{NUM})%)?"),
                  running="set", tokens=("prompt", "gen"), moves=("kv",)),),
        per_step=True, interval=10.0, knows_running=True),
    commands=("vllm serve", "vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"),
    executables=(PYTHON,),
    more="/metrics is on by default; its log needs log stats on (no --disable-log-stats)",
    caches=("{home}/.cache/vllm",),  # its torch.compile cache (torch_compile_cache/)
)
