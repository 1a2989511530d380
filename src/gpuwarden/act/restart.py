"""Starting a killed engine again through what supervises it: its systemd unit, or its Docker container.
gpuwarden starts nothing itself (an engine's command line, user and environment are its supervisor's to know).

It asks for a start, not a restart: after the kill the unit or container has stopped, and a supervisor with a
restart policy of its own (systemd Restart=always, Docker --restart) may already have started it again, which
a restart would kill once more. It first waits (bounded) until the supervisor has seen the death: a start asked
for while systemd or dockerd still holds the killed process for the unit's or container's main one is a no-op.

Whether it is back is not this module's to say: the engine's lifecycle waits for a real completion
(engine_back) or for restart_timeout (engine_restart_failed)."""

from __future__ import annotations

import subprocess
import time

from gpuwarden.config import EngineTarget
from gpuwarden.engine import dockerapi
from gpuwarden.offloop import OffLoop

DEADLINE = 30.0  # systemctl --no-block returns once the job is queued; dockerd once the process runs
SEEN_DEAD = 15.0  # how long the supervisor may take to see its main process gone
_STARTS = OffLoop("engine start", limit=8)


class RestartError(Exception):
    """Its supervisor could not be asked, or refused (for people: the event says it)."""


def supervisor(target: EngineTarget) -> str:
    """Who starts it again, for people."""
    return f"systemd unit {target.unit}" if target.kind == "unit" else f"Docker container {target.container}"


async def start(name: str, target: EngineTarget, dead: frozenset[int]) -> str:
    """Ask its supervisor to start it, once it no longer names one of the `dead` (killed) processes as its
    main one; what happened, for people, or RestartError."""
    try:
        return await _STARTS.run(name, DEADLINE, _start, target, dead)
    except TimeoutError:
        raise RestartError(f"{supervisor(target)} did not answer within {DEADLINE:.0f} s") from None


def _start(target: EngineTarget, dead: frozenset[int]) -> str:
    if target.kind == "unit":
        _until_seen_dead(lambda: _main_pid(target.unit), dead)
        return _start_unit(target.unit)
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


def _main_pid(unit: str) -> int:
    try:
        out = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", "--", unit], capture_output=True,
                             text=True, timeout=5, stdin=subprocess.DEVNULL).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return int(out) if out.isdigit() else 0


def _container_pid(target: EngineTarget) -> int:
    state = dockerapi.inspect(target.docker_socket, target.container).get("State") or {}
    return int(state.get("Pid") or 0) if state.get("Running") else 0


def _start_unit(unit: str) -> str:
    # --no-block: the start job is queued and systemctl returns; a unit of Type=notify that loads a model for
    # minutes must not hold a thread for them (the lifecycle waits for it to serve)
    try:
        done = subprocess.run(["systemctl", "--no-block", "start", "--", unit], capture_output=True, text=True,
                              timeout=DEADLINE - 1, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RestartError(f"systemctl start {unit}: {exc}") from None
    if done.returncode:
        raise RestartError(f"systemctl start {unit}: {(done.stderr or done.stdout).strip()[:300]}")
    return f"asked systemd to start {unit}"
