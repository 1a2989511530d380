"""What an engine's configuration makes: where its processes are found (its target), its API, the source its
progress is read from, and its lifecycle's rules and stall detector. Pure, but for the source it opens."""

from __future__ import annotations

from urllib.parse import urlsplit

from gpuwarden import enginekinds
from gpuwarden.config.settings import SCHEME_PORTS, EngineConfig, user_id
from gpuwarden.engine import lifecycle as lc
from gpuwarden.engine.logs import LogScraper
from gpuwarden.engine.processes import TargetSpec
from gpuwarden.engine.scraper import Scraper
from gpuwarden.engine.slots import SlotsScraper
from gpuwarden.engine.stall import StallDetector
from gpuwarden.runtime.sockets import pinned

# How long a fault with no owner keeps an engine under suspicion (each new one starts it again): a GPU that a
# fault left hanging shows it within seconds; a suspicion for ever would judge every long request on the floor.
SUSPICION = 300.0
_CANARY_EVERY = 2.0  # at most this often a starting engine that answers is asked for a completion

Source = Scraper | LogScraper | SlotsScraper  # where its progress is read: /metrics, its log, /slots


def target_spec(config: EngineConfig) -> TargetSpec:
    t, url = config.target, urlsplit(pinned(config.metrics_url))
    return TargetSpec(t.kind, port=url.port or SCHEME_PORTS[url.scheme], host=url.hostname, pidfile=t.pidfile,
                      pattern=t.pattern, unit=t.unit, cgroup=t.cgroup, container=t.container,
                      docker_socket=t.docker_socket, uid=user_id(t.user) if t.user else None)


def base_url(config: EngineConfig) -> str:
    """The engine's API: `url`, else metrics_url's scheme, host and port."""
    if config.url:
        return pinned(config.url.rstrip("/"))
    parts = urlsplit(pinned(config.metrics_url))
    return f"{parts.scheme}://{parts.netloc}"


def source_of(config: EngineConfig, owner=lambda: None) -> Source:
    """`owner`: the engine's user as known now (a log file is read only when root's or that user's)."""
    if config.source == "log":
        return LogScraper.of(config.log_file, config.log_unit, config.profile, config.log_container,
                             config.target.docker_socket, owner)
    if config.source == "slots":
        return SlotsScraper(base_url(config), config.scrape_timeout, config.max_body_bytes)
    return Scraper(pinned(config.metrics_url), config.profile, config.scrape_timeout, config.max_body_bytes)


def stall_floor(config: EngineConfig) -> float:
    """A log says progress only every so often (vLLM: every 10 s): a stall is at least two such intervals."""
    if config.source != "log":
        return config.min_stall
    kind = enginekinds.named(config.profile)
    logs = [kind.log] if kind else [k.log for k in enginekinds.all_kinds() if k.log]
    return max(config.min_stall, *(2 * p.interval for p in logs))


def rules_of(config: EngineConfig) -> lc.Rules:
    return lc.Rules(config.unresponsive_after, config.kill_grace, config.crash_loop_exits, config.crash_loop_window,
                    config.restart_timeout, max(config.scrape_interval, _CANARY_EVERY), config.kill_budget_window,
                    confirm_stall=config.source == "log",
                    idle_canary_every=0.0 if config.canary == "off" else config.canary_interval, suspicion=SUSPICION,
                    kill_stall=_kills(config, config.on_stall), kill_silence=_kills(config, config.on_unresponsive))


def _kills(config: EngineConfig, setting: str) -> bool:
    """Its setting may ask a real kill (policy.py decides; a dry run is none)."""
    return setting in ("kill", "restart") and not config.dry_run


def lifecycle_of(config: EngineConfig) -> lc.Lifecycle:
    floor = stall_floor(config)
    return lc.Lifecycle(rules_of(config), lambda: StallDetector(config.stall_multiple, floor, config.max_stall))
