"""A bounded load on an engine's OpenAI-compatible /v1/completions, on loopback only: `streams` threads each
send one request after another until stopped or past the deadline. Prompts are random token ids (the tiny
models have no tokenizer), and `ignore_eos` makes every request generate exactly `max_tokens` tokens."""

from __future__ import annotations

import ipaddress
import json
import random
import threading
import time
import urllib.request
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Result:
    ok: bool
    seconds: float
    tokens: int
    error: str = ""


class Load:
    def __init__(self, url: str, streams: int = 4, max_tokens: int = 500, prompt_tokens: int = 16,
                 deadline: float = 300.0, timeout: float = 300.0, requests: int | None = None, seed: int = 0,
                 key: str | None = None) -> None:
        """`seed`: where each stream's random prompts start (another seed, other prompts: no cached prefix);
        `key`: the engine's API key, sent as its clients do (Authorization: Bearer)."""
        host = urlsplit(url).hostname or ""
        if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"load goes to loopback only, not {host}")
        self.url = url.rstrip("/") + "/v1/completions"
        self.streams, self.max_tokens, self.prompt_tokens = streams, max_tokens, prompt_tokens
        self.deadline, self.timeout, self.requests, self.seed = deadline, timeout, requests, seed
        self.headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        self.results: list[Result] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._started = 0.0

    def start(self) -> Load:
        self._started = time.monotonic()
        self._threads = [threading.Thread(target=self._stream, args=(i,), daemon=True) for i in range(self.streams)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, wait: float = 5.0) -> list[Result]:
        self._stop.set()
        for thread in self._threads:
            thread.join(wait)
        return self.results

    def __enter__(self) -> Load:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop(0)

    def _more(self) -> bool:
        if self._stop.is_set() or time.monotonic() - self._started > self.deadline:
            return False
        with self._lock:
            if self.requests is not None and self.requests <= 0:
                return False
            if self.requests is not None:
                self.requests -= 1
        return True

    def _stream(self, seed: int) -> None:
        rng = random.Random(self.seed * 1000 + seed)
        while self._more():
            body = {"model": "tiny-llama", "prompt": [rng.randrange(3, 1000) for _ in range(self.prompt_tokens)],
                    "max_tokens": self.max_tokens, "ignore_eos": True, "temperature": 0}
            request = urllib.request.Request(self.url, json.dumps(body).encode(), self.headers)
            start = time.monotonic()
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    usage = json.loads(response.read()).get("usage", {})
                result = Result(True, time.monotonic() - start, usage.get("completion_tokens", 0))
            except Exception as exc:  # a killed engine drops its connections: that is a result, not a crash
                result = Result(False, time.monotonic() - start, 0, f"{type(exc).__name__}: {exc}")
            with self._lock:
                self.results.append(result)
