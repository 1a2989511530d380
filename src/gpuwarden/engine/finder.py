"""Discovery, the component: every `discover_interval`, look for engine servers on this host (off the loop, with a
deadline), probe each new one for a source, and report what it found to the engines component through a narrow
port (`Watched`). Anyone can start a server that looks like an engine: it watches a bounded number, alerts only,
and says once which it skips."""

from __future__ import annotations

import asyncio
import logging
import pwd
import time
from typing import Protocol

from gpuwarden import enginekinds
from gpuwarden.config.settings import EngineConfig, EnginesConfig
from gpuwarden.core.model import Event, Severity, Sink
from gpuwarden.engine.discovery import Found, discover, probe_order, with_source
from gpuwarden.runtime.offloop import Busy, OffLoop

log = logging.getLogger(__name__)

_DISCOVERY = OffLoop("discovery", limit=2)  # a /proc walk and one probe at a time
_DEADLINE = 30.0


class Watched(Protocol):
    """What discovery tells the engines component (engine/watch.py's EngineWatch)."""

    def adopt(self, config: EngineConfig, lookalike: bool, crowd: str | None = None) -> None: ...

    def drop(self, name: str) -> None: ...


def config_of(found: Found) -> EngineConfig:
    """Alert-only: anyone can start a server that looks like an engine; kills need a configuration."""
    return EngineConfig(name=found.name, metrics_url=found.metrics_url, profile=found.profile, source=found.source,
                        log_unit=found.log_unit, log_container=found.log_container,
                        canary_interval=enginekinds.named(found.profile).idle_canary, on_stall="alert",
                        on_gpu_fault="alert", on_unresponsive="alert", target=found.target)


_RANKS = ("a server that only looks like an engine", "root's installed program, run by anyone",
          "in a system unit or a container", "holding a GPU")


def crowd_of(found: Found) -> str:
    """The user whose discovered servers page together: anyone can start many (alert/storm.py groups them)."""
    if found.uid is None:
        return "discovered engines of an unknown user"
    try:
        return f"discovered engines of {pwd.getpwuid(found.uid).pw_name}"
    except KeyError:
        return f"discovered engines of uid {found.uid}"


class Discovery:
    name = "discovery"

    def __init__(self, settings: EnginesConfig, engines: Watched, sink: Sink) -> None:
        self.settings, self.engines, self.sink = settings, engines, sink
        self._watched: dict[str, int] = {}  # what it handed over: name → its rank (Found.rank)
        self._unwatchable: set[str] = set()  # already said to offer no source
        self._skipped: set[str] = set()  # already said to be past max_discovered
        self._probed: dict[str, float] = {}  # when each server was last probed for a source
        self._flooded = False  # the discovery_flood alert was sent for the crowd now skipped

    async def run(self) -> None:
        first = True
        while True:
            try:
                found = await _DISCOVERY.run("processes", _DEADLINE, discover)
            except (Busy, TimeoutError):
                log.warning("looking for engine servers took longer than %.0f s; trying again", _DEADLINE)
            else:
                await self._found(found)
                if first and not found:
                    log.info("no engines configured and none found running (%s)",
                             ", ".join(k.title for k in enginekinds.all_kinds()))
                first = False
            await asyncio.sleep(self.settings.discover_interval)

    async def _found(self, found: list[Found]) -> None:
        # Anyone can start servers that look like engines: root watches (and probes) a bounded number.
        cap = self.settings.max_discovered
        for f in probe_order([f for f in found if f.name not in self._watched], self._probed)[:cap]:
            if len(self._watched) >= cap and not self._make_room(f.rank):
                break  # the rest rank no higher
            self._probed[f.name] = time.monotonic()
            try:
                f = await _DISCOVERY.run("probe", _DEADLINE, with_source, f)
            except (Busy, TimeoutError):
                continue  # probed again on a later round
            if f.source != "none":
                log.info("discovered %s serving on port %d (%s): watching it through %s, alerts only; for more: "
                         "%s", f.profile, f.port, f.place, f.through, f.more)
                self._watched[f.name] = f.rank
                self.engines.adopt(config_of(f), lookalike=not f.rank, crowd=crowd_of(f))
            elif f.name not in self._unwatchable:
                self._unwatchable.add(f.name)
                log.warning("discovered %s serving on port %d (%s), but no source to watch it through answers: %s",
                            f.profile, f.port, f.place, f.more)
        self._say_skipped([f for f in found if f.name not in self._watched] if len(self._watched) >= cap else [],
                          cap)

    def _make_room(self, rank: int) -> bool:
        """Stop watching the lowest-ranked server, for one of a higher `rank`; False when none ranks lower."""
        name = min(self._watched, key=self._watched.__getitem__, default=None)
        if name is None or self._watched[name] >= rank:
            return False
        lower = self._watched.pop(name)
        self.engines.drop(name)
        log.info("no longer watching %s, %s: a server with more to vouch for it needs its place", name, _RANKS[lower])
        return True

    def _say_skipped(self, skipped: list[Found], cap: int) -> None:
        if not skipped:
            self._flooded = False  # the crowd is gone: a new one is news again
            return
        new = [f for f in skipped if f.name not in self._skipped]
        if not new:
            return
        self._skipped.update(f.name for f in new)
        names = ", ".join(f"{f.name} ({f.place})" for f in new[:10]) + (f" and {len(new) - 10} more"
                                                                       if len(new) > 10 else "")
        log.warning("discovered more engine servers than [engines] max_discovered (%d) watches; not watching %s. "
                    "Configure the engines to watch ([[engine]]): configured ones are always watched", cap, names)
        if self._flooded:
            return
        self._flooded = True  # one alert for a crowd: look-alikes are cheap to start, none is a page
        self.sink.record([Event("discovery_flood", Severity.WARNING,
                                f"{len(new)} more engine-like servers than [engines] max_discovered ({cap}) watches: "
                                "not watched; configure the engines to watch ([[engine]])", time.time(),
                                evidence={"skipped": [f.name for f in new], "max_discovered": cap})])
