"""Run components, restart the ones that fail with exponential backoff, and say who is healthy."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gpuwarden.core import families
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.core.model import Event, Severity, Sink

log = logging.getLogger(__name__)


class Component(Protocol):
    name: str

    async def run(self) -> None: ...


@dataclass(eq=False, repr=False)
class _State:
    """A supervised task's state."""

    up: bool = False
    done: bool = False  # returned on its own: nothing to do (no engine to watch), not down
    restarts: int = 0
    failures_in_row: int = 0


class Supervisor:
    """Each component runs in its own task; one that raises is logged, reported and started again after
    `backoff` seconds (doubling up to `max_backoff`, reset after it ran `stable_after` seconds)."""

    def __init__(
        self,
        on_crash: Callable[[str, BaseException], None],
        on_state: Callable[[str, bool, int], None],
        *,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        stable_after: float = 60.0,
        unhealthy_after: int = 5,
    ) -> None:
        self._on_crash, self._on_state = on_crash, on_state
        self.backoff, self.max_backoff, self.stable_after = backoff, max_backoff, stable_after
        self.unhealthy_after = unhealthy_after
        self._tasks: dict[str, asyncio.Task] = {}
        self._states: dict[str, _State] = {}
        self._stopping = False

    def start(self, name: str, factory: Callable[[], Component] | Component) -> None:
        """`factory` builds a fresh component for every (re)start, so a restart never reuses broken state; a
        component itself (it has `run`) is run again as it is: one whose state must outlive a restart."""
        self._stopping = False
        self._states[name] = _State()
        self._tasks[name] = asyncio.create_task(self._keep_running(name, factory), name=name)

    async def _keep_running(self, name: str, factory: Callable[[], Component] | Component) -> None:
        state, delay = self._states[name], self.backoff
        while True:
            started = time.monotonic()
            try:
                built = isinstance(factory, type) or not hasattr(factory, "run")  # a class is a factory too
                component = factory() if built else factory
                self._set(name, state, True)
                await component.run()
                log.info("component %s finished", name)
                state.done = True
                self._set(name, state, False)
                return
            except asyncio.CancelledError:
                self._set(name, state, False)
                raise
            except Exception as exc:
                if self._stopping:
                    # failing while being stopped (a component that turned its cancellation into an error):
                    # that is the stop, not a crash; nothing is restarted
                    self._set(name, state, False)
                    raise asyncio.CancelledError from exc
                while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
                    exc = exc.exceptions[0]  # a component's TaskGroup wraps what actually failed
                if time.monotonic() - started >= self.stable_after:
                    delay, state.failures_in_row = self.backoff, 0
                state.restarts += 1
                state.failures_in_row += 1
                self._set(name, state, False)
                log.error("component %s failed (%s: %s); restarting in %.0f s", name, type(exc).__name__,
                          exc, delay, exc_info=exc)
                self._on_crash(name, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_backoff)

    def _set(self, name: str, state: _State, up: bool) -> None:
        state.up = up
        self._on_state(name, up or state.done, state.restarts)  # one that finished its work is not down

    def healthy(self) -> bool:
        """False once any component has failed `unhealthy_after` times in a row."""
        return all(s.failures_in_row < self.unhealthy_after for s in self._states.values())

    def summary(self) -> str:
        down = [n for n, s in self._states.items() if not s.up and not s.done]
        return f"{len(self._states) - len(down)}/{len(self._states)} components up" + (
            f" (down: {', '.join(down)})" if down else "")

    async def stop(self, timeout: float = 3.0) -> list[str]:
        """Cancel every component and wait up to `timeout`; nothing is restarted from now on. Returns the
        components still running (they swallowed their cancellation): the caller decides how to end them."""
        self._stopping = True
        for task in self._tasks.values():
            task.cancel()
        stuck: list[str] = []
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks.values(), timeout=timeout)
            stuck = sorted(t.get_name() for t in pending)
            for name in stuck:
                log.error("component %s did not stop within %.0f s", name, timeout)
        self._tasks.clear()
        self._states.clear()
        return stuck


class Components:
    """The supervisor's reports: a component that failed is an event, each one's state two gauges."""

    def __init__(self, sink: Sink, metrics: SelfMetrics) -> None:
        self.sink, self.metrics = sink, metrics

    def crashed(self, name: str, exc: BaseException) -> None:
        try:
            self.sink.record([Event("watchdog_error", Severity.WARNING, f"component {name} failed: {exc}",
                                    time.time(), evidence={"component": name, "error": repr(exc)})])
        except Exception:
            log.exception("could not record the failure of %s", name)

    def component_state(self, name: str, up: bool, restarts: int) -> None:
        self.metrics.set(families.COMPONENT_UP, 1 if up else 0, name)
        self.metrics.set(families.COMPONENT_RESTARTS, restarts, name)
