"""Starting a killed engine again through what supervises it: its systemd unit, or its Docker container.
gpuwarden starts nothing itself (an engine's command line, user and environment are its supervisor's to know).

It asks for a start, not a restart: after the kill the unit or container has stopped, and a supervisor with a
restart policy of its own (systemd Restart=always, Docker --restart) may already have started it again, which
a restart would kill once more. It first waits (bounded) until the supervisor has seen the death: a start asked
for while systemd or dockerd still holds the killed process for the unit's or container's main one is a no-op.

A supervisor that does not answer (dockerd paused, systemd busy) or refuses (a start job that fails, a unit
masked for a moment) is asked again with backoff until the restart's deadline (`restart_timeout` from the
kill): one blip is never a give-up. Only when that time is spent does it fail, saying how often it asked, for
how long, the exact command a person runs instead, and the last answer.

Whether it is back is not this module's to say: the engine's lifecycle waits for a real completion
(engine_back) or for restart_timeout (engine_restart_failed)."""

from __future__ import annotations

import asyncio
import itertools
import shlex
import subprocess
import time
from collections.abc import Callable

from gpuwarden.config.settings import EngineTarget
from gpuwarden.engine import dockerapi
from gpuwarden.runtime.offloop import Busy, OffLoop

DEADLINE = 30.0  # one ask: systemctl --no-block returns once the job is queued; dockerd once the process runs
SEEN_DEAD = 15.0  # how long the supervisor may take to see its main process gone
JOB_SEEN = 10.0  # how long a queued systemd start job may take to run its main process, or fail
BACKOFF = (1.0, 2.0, 4.0, 8.0, 15.0)  # seconds between asks, then the last one again until the deadline
MIN_ASK = 0.5  # an ask needs this much of the deadline left (the last pause ends at the deadline itself)
_STARTS = OffLoop("engine start", limit=8)


class RestartError(Exception):
    """Its supervisor could not be asked, or refused (for people: the event says it)."""


def supervisor(target: EngineTarget) -> str:
    """Who starts it again, for people."""
    return f"systemd unit {target.unit}" if target.kind == "unit" else f"Docker container {target.container}"


def command(target: EngineTarget) -> str:
    """What a person runs to do what gpuwarden asks for (the Engine API's start is `docker start`)."""
    if target.kind == "unit":
        return f"systemctl start {shlex.quote(target.unit or '')}"
    return f"docker start {shlex.quote(target.container or '')}"


async def start(name: str, target: EngineTarget, dead: frozenset[int], until: float,
                retrying: Callable[[str], None] | None = None) -> str:
    """Ask its supervisor to start it, once it no longer names one of the `dead` (killed) processes as its
    main one; an ask that fails is made again with backoff until `until` (monotonic). `retrying(error)` is
    called once, at the first failure. What happened, for people; or RestartError once the time is spent,
    saying what was tried."""
    asks, first_ask, last = 0, time.monotonic(), ""
    for pause in itertools.chain(BACKOFF, itertools.repeat(BACKOFF[-1])):
        left = until - time.monotonic()
        if left < MIN_ASK:
            break
        asks += 1
        try:
            done = await _STARTS.run(name, min(DEADLINE, left), _start, target, dead)
        except TimeoutError:
            last = f"{supervisor(target)} did not answer within {min(DEADLINE, left):.0f} s"
        except (RestartError, Busy) as exc:
            last = str(exc)
        else:
            return done if asks == 1 else f"{done} (ask {asks}, {time.monotonic() - first_ask:.0f} s after the first)"
        if retrying and asks == 1:
            retrying(last)
        await asyncio.sleep(max(0.0, min(pause, until - time.monotonic())))
    times = "once" if asks == 1 else f"{asks} times"
    raise RestartError(f"its {supervisor(target)} was asked {times} (`{command(target)}`) and did not start it; the "
                       f"last answer: {last}")


def _start(target: EngineTarget, dead: frozenset[int]) -> str:
    if target.kind == "unit":
        _until_seen_dead(lambda: _unit_state(target.unit).get("MainPID", 0), dead)
        return _start_unit(target.unit, dead)
    if target.kind == "docker":
        try:
            _until_seen_dead(lambda: _container_pid(target), dead)
            started = dockerapi.start(target.docker_socket, target.container)
        except dockerapi.DockerError as exc:
            raise RestartError(str(exc)) from None
        return f"started container {target.container}" if started else \
            f"container {target.container} was already running again (its restart policy)"
    raise RestartError(f"nothing supervises a target of kind {target.kind!r}")


def _until_seen_dead(main_pid, dead: frozenset[int]) -> None:
    deadline = time.monotonic() + SEEN_DEAD
    while main_pid() in dead and time.monotonic() < deadline:
        time.sleep(0.1)


def _container_pid(target: EngineTarget) -> int:
    state = dockerapi.inspect(target.docker_socket, target.container).get("State") or {}
    return int(state.get("Pid") or 0) if state.get("Running") else 0


_PROPS = ("MainPID", "ActiveState", "Result", "ExecMainStartTimestampMonotonic", "InactiveExitTimestampMonotonic")


def _unit_state(unit: str) -> dict:
    """The unit's properties that say whether a start ran (numbers as ints); RestartError when systemd does not
    answer (no bus, a hung manager), with what systemctl said."""
    try:
        done = subprocess.run(["systemctl", "show", *(f"--property={p}" for p in _PROPS), "--", unit],
                              capture_output=True, text=True, timeout=5, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RestartError(f"systemctl show {unit}: {exc}") from None
    if done.returncode:
        raise RestartError(f"systemctl show {unit}: {' '.join((done.stderr or done.stdout).split())[:300]}")
    state = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    return {k: int(v) if v.isdigit() else v for k, v in state.items()}


def _start_unit(unit: str, dead: frozenset[int]) -> str:
    """`systemctl --no-block start`, then the job's outcome: its main process started (the lifecycle judges the
    rest), or the job failed before it (a failing ExecStartPre=, a dependency): a refusal, asked again."""
    before = _unit_state(unit)
    # --no-block: the start job is queued and systemctl returns; a unit of Type=notify that loads a model for
    # minutes must not hold a thread for them (the lifecycle waits for it to serve)
    try:
        done = subprocess.run(["systemctl", "--no-block", "start", "--", unit], capture_output=True, text=True,
                              timeout=DEADLINE - JOB_SEEN - 1, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RestartError(f"systemctl start {unit}: {exc}") from None
    if done.returncode:
        raise RestartError(f"systemctl start {unit}: {' '.join((done.stderr or done.stdout).split())[:300]}")
    deadline = time.monotonic() + JOB_SEEN
    while True:
        now = _unit_state(unit)
        main = now.get("MainPID", 0)
        if now.get("ExecMainStartTimestampMonotonic") != before.get("ExecMainStartTimestampMonotonic") or \
                (now.get("ActiveState") == "active" and main and main not in dead):
            return f"systemd started {unit}" + (f" (main process {main})" if main else "")
        left = now.get("InactiveExitTimestampMonotonic") != before.get("InactiveExitTimestampMonotonic")
        if left and now.get("ActiveState") in ("failed", "inactive"):
            raise RestartError(f"systemctl start {unit}: its start job failed before its main process ran "
                               f"(Result={now.get('Result') or '?'})")
        if time.monotonic() >= deadline:
            if now.get("ActiveState") == "activating":  # ExecStartPre= still runs: the lifecycle waits for it
                return f"systemd is starting {unit} (its start job still runs)"
            raise RestartError(f"systemctl start {unit}: no start seen within {JOB_SEEN:.0f} s "
                               f"(ActiveState={now.get('ActiveState') or '?'})")
        time.sleep(0.2)
