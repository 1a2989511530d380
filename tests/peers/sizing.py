"""Workloads sized by measurement: a test that needs a prefill or a request lasting some seconds times the
engine on this machine first, and sizes its prompt or its tokens from the rate, so that it proves the same thing
on a fast machine as on a slow one (a fixed 7,000-token prompt was over in 6 s on one machine and lasted tens
of seconds on another)."""

from __future__ import annotations

import math
import time

from peers.load import Load


class TooFast(Exception):
    """The context cannot hold a workload that lasts long enough here: the test cannot prove its point."""


def rate(short_tokens: int, short_seconds: float, long_tokens: int, long_seconds: float) -> float:
    """Tokens a second, from two timed requests that differ only in those tokens: the difference cancels what
    each request costs beside them (HTTP, scheduling, the rest of its work), which would make a fast engine
    look slow and its workload too short."""
    if long_tokens <= short_tokens:
        raise ValueError(f"the long request ({long_tokens} tokens) must have more than the short ({short_tokens})")
    extra = long_seconds - short_seconds
    if extra <= 0:
        raise ValueError(f"{long_tokens} tokens took {long_seconds:.2f} s, no longer than {short_tokens} "
                         f"({short_seconds:.2f} s): no rate to measure")
    return (long_tokens - short_tokens) / extra


def tokens_for(rate: float, seconds: float, least: int, most: int, what: str = "prefill") -> int:
    """The tokens that last `seconds` at `rate` tokens a second, at least `least`. The rate is measured on short
    requests and a longer one costs more a token (attention over a longer context), so they last at least that
    long. Raises TooFast when the context (`most` tokens) cannot hold them."""
    if rate <= 0 or seconds <= 0:
        raise ValueError(f"a rate ({rate}) and a duration ({seconds}) must be positive")
    tokens = max(least, math.ceil(rate * seconds))
    if tokens > most:
        raise TooFast(f"this engine's {what} runs at {rate:.0f} tokens/s: {seconds:.0f} s of it needs {tokens} "
                      f"tokens, more than its context holds ({most})")
    return tokens


def stall_floor(rate: float, step_tokens: int, least: float, multiple: float = 3.0) -> float:
    """A min_stall that one engine step cannot reach here: `multiple` x the seconds a step of `step_tokens`
    (a prefill chunk, a prompt batch) takes at `rate`, at least `least`, to the 0.1 s above. The daemon judges the
    first steps on min_stall alone (it has seen none to learn from), so a floor below a step would call a
    healthy engine on a slow machine stalled."""
    if rate <= 0:
        raise ValueError(f"a rate ({rate}) must be positive")
    return max(least, math.ceil(multiple * step_tokens / rate * 10) / 10)


def timed(url: str, prompt_tokens: int, max_tokens: int, seed: int, timeout: float = 300.0) -> float:
    """Seconds one request takes, alone on the engine (`seed`: its own random prompt, nothing of it cached)."""
    with Load(url, streams=1, requests=1, prompt_tokens=prompt_tokens, max_tokens=max_tokens, timeout=timeout,
              seed=seed) as load:
        deadline = time.monotonic() + timeout + 5
        while not load.results and time.monotonic() < deadline:
            time.sleep(0.05)
    if not load.results or not load.results[0].ok:
        raise AssertionError(f"a {prompt_tokens}-token prompt for {max_tokens} tokens did not complete: "
                             f"{load.results or f'nothing in {timeout:.0f} s'}")
    return load.results[0].seconds


def measured_rate(url: str, what: str, probe: int, seed: int = 10) -> tuple[float, str]:
    """The engine's prefill (prompt tokens) or decode (generated tokens) rate, from a 16-token request and one
    of `probe` tokens, after a first long one that warms it up (what runs first on an engine may pay once for
    its shapes: that would make it look slow); and how it was measured, to print."""
    if what not in ("prefill", "decode"):
        raise ValueError(f"what: 'prefill' or 'decode', not {what!r}")

    def long_request(seed: int) -> float:
        return timed(url, probe, 2, seed) if what == "prefill" else timed(url, 16, probe, seed)
    long_request(seed)
    short = timed(url, 16, 2, seed + 1)  # a 16-token prompt, 2 tokens generated
    long = long_request(seed + 2)
    measured = rate(16 if what == "prefill" else 2, short, probe, long)
    return measured, f"{what} {measured:.0f} tokens/s ({probe} tokens in {long:.2f} s, a short request in " \
                     f"{short:.2f} s)"


def sized(url: str, what: str, seconds: float, probe: int, context: int) -> tuple[int, str]:
    """The tokens of prompt (`what` = "prefill") or of generation ("decode") that keep the engine at it for
    `seconds` here, at least `probe`, within a `context`-token context beside a 16-token prompt; and how they
    were found, to print. Raises TooFast (say it in a skip: as root, CI fails on it)."""
    measured, how = measured_rate(url, what, probe)
    tokens = tokens_for(measured, seconds, least=probe, most=context - 16, what=what)
    return tokens, f"{how}: {tokens} tokens for {seconds:.0f} s"
