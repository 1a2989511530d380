"""Blocking calls off the event loop, bounded: each in a daemon thread of its pool, at most one in flight per key
(single flight), at most `limit` calls running per pool, each awaited for at most its deadline.

A call that overruns its deadline is abandoned, not killed (Python cannot stop a thread): its thread still
counts until it returns, so a hung device or server holds at most one thread per key and `limit` in all, and
never the default executor that the rest of the daemon (and its shutdown) shares. The threads are daemon
threads: a stop never waits for them.

A thread that returned parks for `IDLE` seconds and takes the pool's next call: handing a call to a parked thread
is a queue put, where starting a thread makes the loop wait until the new thread runs (`Thread.start` blocks on
it). With 32 engines looked at every few seconds on a busy box, that wait blocked the loop for up to a second.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T")
IDLE = 60.0  # seconds a thread waits for its pool's next call before it ends


class Busy(Exception):
    """The previous call for this key has not returned yet, or the pool is full: this one was not started."""


class _Call(NamedTuple):
    key: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


class OffLoop:
    def __init__(self, name: str, limit: int) -> None:
        self.name, self.limit = name, limit
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self._parked: list[queue.SimpleQueue[_Call]] = []  # each parked thread's inbox, the latest parked last

    def busy(self, key: str) -> bool:
        with self._lock:
            return key in self._running

    async def run(self, key: str, deadline: float, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` in a thread; TimeoutError after `deadline` seconds, Busy when not started."""
        loop = asyncio.get_running_loop()
        call = _Call(key, fn, args, kwargs, loop, loop.create_future())
        with self._lock:
            if key in self._running:
                raise Busy(f"the previous {self.name} call for {key} has not returned yet")
            if len(self._running) >= self.limit:
                raise Busy(f"{self.limit} {self.name} calls are still running")
            self._running.add(key)
            inbox = self._parked.pop() if self._parked else None
        if inbox is not None:
            inbox.put(call)
        else:
            try:
                threading.Thread(target=self._serve, args=(call,), name=f"{self.name}:{key}", daemon=True).start()
            except BaseException:
                with self._lock:
                    self._running.discard(key)
                raise
        async with asyncio.timeout(deadline):  # not wait_for: on 3.11 it can swallow a cancellation
            return await call.future

    def _serve(self, call: _Call) -> None:
        """Run `call`, then each call handed to this thread while it is parked, until it has waited IDLE."""
        inbox: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        while True:
            threading.current_thread().name = f"{self.name}:{call.key}"
            try:
                outcome, value = "set_result", call.fn(*call.args, **call.kwargs)
            except BaseException as exc:  # handed to the awaiting coroutine
                outcome, value = "set_exception", exc
            with self._lock:  # parked before the caller hears back, so that its next call finds this thread
                self._running.discard(call.key)
                self._parked.append(inbox)
            try:
                call.loop.call_soon_threadsafe(_settle, call.future, outcome, value)
            except RuntimeError:
                pass  # the loop is gone: nobody waits any more
            del call, value  # a parked thread holds nothing of the call it made (a 7 MB body to parse, say)
            try:
                call = inbox.get(timeout=IDLE)
            except queue.Empty:
                with self._lock:
                    if inbox in self._parked:
                        self._parked.remove(inbox)
                        return
                call = inbox.get()  # taken off the parked list just now: its call is on the way


def _settle(future: asyncio.Future, outcome: str, value: Any) -> None:
    if not future.done():
        getattr(future, outcome)(value)
