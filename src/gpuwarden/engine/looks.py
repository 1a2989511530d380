"""A look at an engine's processes, off the loop and with a deadline: its target resolved, their instance (pid and
start time of each), the candidates refused, each one's CPU, the GPUs they use, their KFD pasids (AMD), and whether
the socket that serves its address is its own (`taken`: who holds it when not)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import psutil

from gpuwarden.config.settings import EngineConfig
from gpuwarden.core.plain import plain
from gpuwarden.engine.kfd import pasids_of
from gpuwarden.engine.lifecycle import Instance
from gpuwarden.engine.parts import target_spec
from gpuwarden.engine.processes import Reads, Tracker, gpus_in_use, port_taken, resolve
from gpuwarden.gpu import vendors
from gpuwarden.runtime.offloop import Busy, OffLoop
from gpuwarden.runtime.procfs import read_small

log = logging.getLogger(__name__)

DEADLINE = 10.0
_INSPECTS = OffLoop("process look-up", limit=64)  # one per engine: a hung NVML holds one thread each, no more


@plain
class Processes:
    """An engine's processes as one look found them."""

    procs: list[psutil.Process]
    instance: Instance
    refused: list[str]  # candidates the target named but may not be killed
    cpus: dict[int, float]  # each process's share of a core since the last look, by pid
    busiest: str | None  # the process with the largest share, as a page names it: "pid 4242 (VLLM::Worker)"
    gpus: frozenset[str] | None
    pasids: frozenset[int] | None  # None: none to read
    taken: str | None = None  # who holds the engine's address when not the engine (uid, pid, command)
    sockets: frozenset[int] = frozenset()  # the inodes of the sockets that serve its address (its own unless taken)


class Looker:
    def __init__(self, nvml: bool = True) -> None:
        # the vendors' pid -> GPU lookups (NVML's), opened on first use; none when off ([gpu] nvml)
        self._by_pid: list[Callable[[], Mapping[int, str]]] | None = None if nvml else []

    async def look(self, name: str, config: EngineConfig, tracker: Tracker, wide: bool = False) -> Processes | None:
        """None: the look-up did not answer within its deadline, or one that outran it still holds its thread (a
        hung NVML): keep what is known. `wide`: a kill's look, whose tree includes what only a read of every
        process of the engine's user finds (Tracker.refresh)."""
        try:
            return await _INSPECTS.run(name, DEADLINE, self._look, config, tracker, wide)
        except TimeoutError:
            log.warning("looking at %s's processes took longer than %.0f s", name, DEADLINE)
        except Busy:
            pass
        return None

    def _look(self, config: EngineConfig, tracker: Tracker, wide: bool = False) -> Processes:
        spec = target_spec(config)
        found = resolve(spec, tracker.uid, (pid for pid, _ in tracker.seen))
        procs = tracker.refresh(found, wide)
        taken = port_taken(spec, found, procs)
        if taken and not wide:  # not the engine's socket on a narrow look: said only if the wide one agrees
            procs = tracker.refresh(found, wide=True)
            taken = port_taken(spec, found, procs)
        gpus = frozenset(config.gpus) if config.gpus else self._gpus_of(procs, found.reads)
        cpus = tracker.cpu_percents(procs, reads=tracker.reads)
        return Processes(procs, instance_of(procs), found.refused, cpus, _named(max(cpus, key=cpus.get, default=None)),
                         frozenset(gpus) if gpus else None, pasids_of([p.pid for p in procs]), taken,
                         frozenset(listener.inode for listener in found.listeners))

    def _gpus_of(self, procs: list[psutil.Process], reads: Reads | None) -> set[str] | None:
        """From the device files they hold open (`reads`: the look's), and from the vendors' libraries (NVML's
        process lists)."""
        found = gpus_in_use(procs, reads=reads) or set()
        if self._by_pid is None:
            self._by_pid = [lookup for v in vendors.all_vendors() if v.process_gpus and (lookup := v.process_gpus())]
        for lookup in self._by_pid:
            by_pid = lookup()
            found |= {by_pid[p.pid] for p in procs if p.pid in by_pid}
        return found or None


def instance_of(procs: list[psutil.Process]) -> Instance:
    """Its processes by pid and start time: a new pid, or the same pid started anew, is a new instance."""
    keys = set()
    for proc in procs:
        try:
            keys.add((proc.pid, proc.create_time()))
        except psutil.Error:
            continue
    return frozenset(keys)


def _named(pid: int | None) -> str | None:
    """`pid 4242 (VLLM::Worker)`: its command as the kernel names it (a thread's title, as ps shows)."""
    if pid is None:
        return None
    try:
        return f"pid {pid} ({read_small(f'/proc/{pid}/comm', 64).decode(errors='replace').strip()})"
    except OSError:
        return f"pid {pid}"
