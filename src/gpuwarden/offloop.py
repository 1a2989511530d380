"""Blocking calls off the event loop, bounded: each in its own daemon thread, at most one in flight per key
(single flight), at most `limit` threads per pool, each awaited for at most its deadline.

A call that overruns its deadline is abandoned, not killed (Python cannot stop a thread): its thread still
counts until it returns, so a hung device or server holds at most one thread per key and `limit` in all, and
never the default executor that the rest of the daemon (and its shutdown) shares. The threads are daemon
threads: a stop never waits for them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Busy(Exception):
    """The previous call for this key has not returned yet, or the pool is full: this one was not started."""


class OffLoop:
    def __init__(self, name: str, limit: int) -> None:
        self.name, self.limit = name, limit
        self._lock = threading.Lock()
        self._running: set[str] = set()

    def busy(self, key: str) -> bool:
        with self._lock:
            return key in self._running

    async def run(self, key: str, deadline: float, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` in a thread; TimeoutError after `deadline` seconds, Busy when not started."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        with self._lock:
            if key in self._running:
                raise Busy(f"the previous {self.name} call for {key} has not returned yet")
            if len(self._running) >= self.limit:
                raise Busy(f"{self.limit} {self.name} calls are still running")
            self._running.add(key)

        def settle(outcome: str, value: Any) -> None:
            if not future.done():
                getattr(future, outcome)(value)

        def work() -> None:
            try:
                outcome, value = "set_result", fn(*args, **kwargs)
            except BaseException as exc:  # handed to the awaiting coroutine
                outcome, value = "set_exception", exc
            finally:
                with self._lock:
                    self._running.discard(key)
            try:
                loop.call_soon_threadsafe(settle, outcome, value)
            except RuntimeError:
                pass  # the loop is gone: nobody waits any more

        try:
            threading.Thread(target=work, name=f"{self.name}:{key}", daemon=True).start()
        except BaseException:
            with self._lock:
                self._running.discard(key)
            raise
        async with asyncio.timeout(deadline):  # not wait_for: on 3.11 it can swallow a cancellation
            return await future
