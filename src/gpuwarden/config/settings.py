"""The TOML configuration: schema, built-in defaults, and validation errors that name key and line."""

from __future__ import annotations

import importlib.util
import math
import os
import pwd
import re
import socket
import stat
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpuwarden import enginekinds
from gpuwarden.config import web as webconfig
from gpuwarden.config.schema import (
    DictOf,
    Invalid,
    ListOf,
    Secret,
    Section,
    boolean,
    field,
    filepath,
    hint,
    integer,
    number,
    one_of,
    secret,
    text,
    then,
)
from gpuwarden.core.eventkinds import KINDS
from gpuwarden.core.model import Severity, normalize_pci
from gpuwarden.core.registry import rules, runbooks
from gpuwarden.runtime.logsetup import redact

DEFAULT_PATH = Path("/etc/gpuwarden/gpuwarden.toml")
# Docker's own rule for container names (daemon/names), which ids (hex) also satisfy: nothing can reach the
# API path beyond /containers/{name}.
CONTAINER_NAME = re.compile(r"/?[a-zA-Z0-9][a-zA-Z0-9_.-]+")
DEFAULT_EXPORTER_PORT = 10440  # the Prometheus port registry's 9100-9999 range is full; this is outside it


class ConfigError(Exception):
    """A configuration that cannot be used; `str()` is the message for the user. `loc` is the key it is about,
    for an error found after parsing (an alert URL apprise refuses), so that `placed` can name the line."""

    def __init__(self, message: str, loc: tuple[Any, ...] = ()) -> None:
        super().__init__(message)
        self.loc = loc


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def parse_duration(value: Any) -> float:
    """Seconds from a number or from text such as "90s", "5m", "1h30m", "250ms", "1w"."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or text such as \"90s\" or \"5m\"")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        seconds = float(value)  # "30" is 30 seconds, as 30 is
    elif isinstance(value, str) and value.strip():
        text = value.strip().replace(" ", "")
        parts = _DURATION.findall(text)
        if "".join(n + u for n, u in parts) != text:
            raise ValueError(f"bad duration {value!r}: use seconds or text such as \"90s\", \"5m\", \"1h30m\"")
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    else:
        raise ValueError("a duration is a number of seconds or text such as \"90s\" or \"5m\"")
    if not math.isfinite(seconds):  # TOML has inf and nan: no timer means either, and nan passes every bound
        raise ValueError(f"a duration is a finite number of seconds, not {seconds}")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


def _at_least(minimum: float, why: str = "0 or less would spin, flood or never finish"):
    def check(seconds: float) -> float:
        if seconds < minimum:
            raise ValueError(f"must be at least {_show(minimum)} ({why})")
        return seconds
    return check


def _show(seconds: float) -> str:
    return f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s"


def _at_most(maximum: float):
    def check(seconds: float) -> float:
        if seconds > maximum:
            raise ValueError(f"must be at most {_show(maximum)} (durations are seconds: write \"{seconds:g}ms\" "
                             "for milliseconds)")
        return seconds
    return check


# The kinds of value a key takes (schema.py): functions from the TOML value to the value kept.
Duration = parse_duration
# How often something runs, or how long it may take: zero would spin a core, flood a receiver or time out at once.
Interval = then(parse_duration, _at_least(0.1))
Period = then(parse_duration, _at_least(1.0))
PciAddress = then(text, normalize_pci)  # "3b:00.0" and "00000000:3B:00.0" -> "0000:3b:00.0"
SeverityName = one_of("info", "warning", "critical")
Number = number()


def _below_resolve_timeout(seconds: float) -> float:
    if seconds >= 300.0:
        raise ValueError(f"{_show(seconds)} is not below Alertmanager's default resolve_timeout (5m): an open alert "
                         "would resolve there between two sends")
    return seconds


def _container_name(value: str) -> str:
    if not CONTAINER_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not a Docker container name or id ([a-zA-Z0-9][a-zA-Z0-9_.-]+)")
    return value


def _absolute(path: Path) -> Path:
    if not path.is_absolute():
        raise ValueError(f"{str(path)!r} is not an absolute path")
    return path


def _not_a_directory(path: Path) -> Path:
    """A file to read lines from: a directory there is a mistake `run` would only find by failing in a loop.
    (`docker run -v /var/log/kern.log:...` on a host without that file makes a directory of it.)"""
    if path.is_dir():
        raise ValueError(f"{str(path)!r} is a directory, not a log file: name the file (in a container, mount a "
                         "file that exists on the host: Docker makes a missing one a directory)")
    return path


ContainerName = then(text, _container_name)
AbsolutePath = then(filepath, _absolute)
LogFile = then(filepath, _absolute, _not_a_directory)


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/gpuwarden")
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "gpuwarden"


class DaemonConfig(Section):
    state_dir: Path = field(AbsolutePath, factory=default_state_dir)
    log_level: str = field(then(text, str.lower, one_of("debug", "info", "warning", "error")), "info")  # INFO too
    loop_lag_warn: float = field(Interval, 1.0)
    status_interval: float = field(Period, 30.0)
    incidents_keep: int = field(integer(ge=1, le=100_000), 100)  # newest incident bundles kept; older deleted


def _web_config(value: Path) -> Path:
    webconfig.load(value)  # read whole now: `run` must not be the first to find a bad key or hash
    return value


def _resolvable(value: str) -> str:
    if (split := _host_and_port(value)) and split[1] > 65535:
        raise ValueError(f"{value!r}: port {split[1]} is above 65535")
    try:
        socket.getaddrinfo(value, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise ValueError(f"{value!r} is not an address to listen on ({exc}); use an address such as "
                         "\"127.0.0.1\", or \"host:port\"") from None
    return value


class ExporterConfig(Section):
    enabled: bool = field(boolean, True)
    listen: str = field(text, "127.0.0.1", check=_resolvable)  # an address; "host:port" and "[v6]:port" set the port
    port: int = field(integer(ge=0, le=65535), DEFAULT_EXPORTER_PORT)
    # TLS and basic auth, node_exporter's --web.config.file form
    web_config_file: Path | None = field(AbsolutePath, None, check=_web_config)

    @classmethod
    def prepare(cls, data: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(listen := data.get("listen"), str):
            return data
        if not (split := _host_and_port(listen)) or split[1] > 65535:  # no port, or one `listen` itself refuses
            return data
        host, port = split
        if "port" in data and data["port"] != port:
            raise ValueError(f"listen {listen!r} names port {port} but port = {data['port']!r}: say it once")
        return {**data, "listen": host, "port": port}


def _host_and_port(listen: str) -> tuple[str, int] | None:
    """`host:port` or `[v6]:port` split; None for a bare address."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\[\]]+):(\d+)", listen.strip())
    return (m.group(1) or m.group(3), int(m.group(2) or m.group(4))) if m else None


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"not a regular expression: {exc}") from None
    return value


# A task's name holds 15 bytes (TASK_COMM_LEN), and the kernel prints it where a user chose it (`<comm>[pid]:
# segfault at`): a `[[kernel.rule]]` expression that a name can hold whole could be matched by any user's process.
SPECIFIC = 16


def _specific_regex(value: str) -> str:
    _regex(value)
    shortest = re._parser.parse(value).getwidth()[0]  # the parser `re` compiles with: the fewest characters a match has
    if shortest < SPECIFIC:
        raise ValueError(f"too short to be specific: a match can be {shortest} characters, and a process's name "
                         f"(15) can hold it; write the driver's message (after its prefix) in {SPECIFIC} or more")
    return value


def _check_kind(value: str) -> str:
    if value not in KINDS:
        raise ValueError(f"unknown event kind {value!r}" + hint(value, KINDS))
    return value


def _check_rule(name: str) -> str:
    if name not in rules():
        raise ValueError(f"unknown built-in rule {name!r}" + hint(name, rules()))
    return name


def _known_runbook(value: str) -> str:
    if value and value not in runbooks():  # else the alert would silently carry no runbook
        raise ValueError(f"unknown runbook {value!r}" + hint(value, runbooks()))
    return value


class KernelRule(Section):
    pattern: str = field(then(text, _specific_regex))  # matched after a driver's prefix (kernel/rules.config_anchored)
    kind: str = field(then(text, _check_kind))
    severity: str = field(SeverityName, "warning")
    vendor: str = field(text, "any")
    meaning: str = field(text, "")
    runbook: str = field(then(text, _known_runbook), "")


NEEDS_JOURNAL = "needs systemd-python, not installed: pip install 'gpuwarden[journal]'"


def journal_readable() -> bool:
    """Whether systemd-python, the optional extra `journal`, is there to read the journal with."""
    return importlib.util.find_spec("systemd") is not None


RuleName = then(text, _check_rule)  # a built-in kernel rule's name (registry.py)


def _kinds(value: dict[str, str]) -> dict[str, str]:
    for kind in value:
        _check_kind(kind)
    return value


def _xids(value: dict[str, str]) -> dict[str, str]:
    for code in value:
        if not code.isdigit():
            raise ValueError(f"Xid keys are numbers, not {code!r}")
    return value


def _rule_takes_a_severity(value: dict[str, str]) -> dict[str, str]:
    for name in value:
        if rules()[name].kind == "xid":
            raise ValueError(f"{name}: an Xid line's severity is its Xid's: set it in [kernel.xid]")
        if rules()[name].quiet:
            raise ValueError(f"{name} makes no event of its own (it only feeds a correlation): nothing to set")
    return value


class KernelConfig(Section):
    source: str = field(one_of("auto", "journal", "kmsg", "file"), "auto")
    file: Path | None = field(LogFile, None)
    lookback: float = field(Duration, 600.0)
    storm_window: float = field(Duration, 2.0)  # 0: every line is its own event
    rule: list[KernelRule] = field(ListOf(KernelRule), [])
    disable_rules: list[str] = field(ListOf(RuleName), [])
    rule_severity: dict[str, str] = field(DictOf(RuleName, SeverityName), {}, check=_rule_takes_a_severity)
    severity: dict[str, str] = field(DictOf(text, SeverityName), {}, check=_kinds)
    xid: dict[str, str] = field(DictOf(text, SeverityName), {}, check=_xids)

    def verify(self) -> None:
        if self.source == "file" and self.file is None:  # else `run` would watch no kernel log at all
            raise ValueError('source = "file" needs file, the log file to follow')
        if self.source == "journal" and not journal_readable():  # else `run` would watch no kernel log at all
            raise ValueError(f'source = "journal" {NEEDS_JOURNAL}; or source = "auto" (/dev/kmsg)')
        if both := sorted(set(self.disable_rules) & set(self.rule_severity)):
            raise ValueError(f"rule {both[0]!r} is in disable_rules and in [kernel.rule_severity]: say which")

    def rule_severities(self) -> dict[str, Severity]:
        return {name: Severity.parse(s) for name, s in self.rule_severity.items()}

    def severity_overrides(self) -> dict[str, Severity]:
        return {kind: Severity.parse(s) for kind, s in self.severity.items()}

    def xid_overrides(self) -> dict[int, Severity]:
        return {int(code): Severity.parse(s) for code, s in self.xid.items()}


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _alert_url(url: Secret) -> Secret:
    """The form every alert URL has (the service's scheme, a valid port), checked here so that the reason is
    said; apprise's own refusal names no reason. The URL itself is never repeated: it carries tokens."""
    value = url.get_secret_value().strip()
    if not _SCHEME.match(value):
        raise ValueError("not a URL: an alert URL starts with its service's scheme, such as ntfys://ntfy.sh/TOPIC, "
                         "mailtos://user:password@host, json://host:port/path (the apprise wiki lists them)")
    # a number after the host is its port (in `tgram://123:token/chat` what follows the colon is a token)
    if (port := re.fullmatch(r"[^/?#]*?(?:\[[^\]]*\])?[^/?#@\[]*:(\d+)", urlsplit(value).netloc)) and not (
            0 < int(port[1]) <= 65535):
        raise ValueError(f"port {port[1]} is not a port: a port is a number from 1 to 65535")
    return url


AlertUrl = then(secret, _alert_url)


class AlertTarget(Section):
    url: Secret = field(AlertUrl)  # apprise URLs carry tokens: printed as '**********'
    name: str | None = field(text, None)  # how logs and metrics call it; default "<n>:<scheme>://<host>"
    min_severity: str = field(SeverityName, "warning")
    tags: list[str] = field(ListOf(text), [])  # when set, only alerts about these kinds, GPUs or engines go here


class AlertsConfig(Section):
    urls: list[Secret] = field(ListOf(AlertUrl), [])  # shorthand for targets at min_severity "warning"
    target: list[AlertTarget] = field(ListOf(AlertTarget), [])
    # an apprise config file (TEXT or YAML); its tags work as `tags` above
    config_file: Path | None = field(AbsolutePath, None)
    config_file_min_severity: str = field(SeverityName, "warning")
    hostname: str = field(text, factory=socket.gethostname)
    cooldown: float = field(Duration, 600.0)
    group_window: float = field(Duration, 5.0)
    retry_initial: float = field(Interval, 5.0)
    retry_max: float = field(Interval, 600.0)
    give_up_after: float = field(Period, 86400.0)
    send_timeout: float = field(Period, 30.0)
    # firing alerts sent again to an Alertmanager this often; at or above its resolve_timeout (5m by default)
    # an open incident would resolve there between two sends
    alertmanager_resend: float = field(then(Interval, _below_resolve_timeout), 60.0)

    def verify(self) -> None:
        if self.retry_max < self.retry_initial:
            raise ValueError(f"retry_max ({_show(self.retry_max)}) is below retry_initial "
                             f"({_show(self.retry_initial)})")


def _user_exists(value: str) -> str:
    user_id(value)
    return value


class EngineTarget(Section):
    """Which processes are the engine: what a kill kills."""

    kind: str = field(one_of("port", "pidfile", "cmdline", "unit", "cgroup", "docker"), "port")
    pidfile: Path | None = field(AbsolutePath, None)
    pattern: str | None = field(then(text, _regex), None)  # cmdline: a regular expression searched in the command line
    unit: str | None = field(text, None)  # unit: a systemd unit, killed as its whole cgroup
    cgroup: Path | None = field(AbsolutePath, None)  # cgroup: a cgroup v2 directory
    container: str | None = field(ContainerName, None)  # docker: a container name or id
    docker_socket: Path = field(AbsolutePath, Path("/var/run/docker.sock"))  # root's dockerd (also for log_container)
    # the engine's user (name or uid); default: the owner of the socket serving metrics_url
    user: str | None = field(then(text, _user_exists), None)

    def verify(self) -> None:
        needed = {"pidfile": "pidfile", "cmdline": "pattern", "unit": "unit", "cgroup": "cgroup",
                  "docker": "container"}.get(self.kind)
        if needed and getattr(self, needed) is None:
            raise ValueError(f"target kind {self.kind!r} needs {needed!r}")
def user_id(user: str) -> int:
    """The uid of a user name or number that exists in the password database."""
    try:
        return pwd.getpwuid(int(user)).pw_uid if user.isdigit() else pwd.getpwnam(user).pw_uid
    except KeyError:
        raise ValueError(f"no such user {user!r}") from None


SCHEME_PORTS = {"http": 80, "https": 443}


def check_metrics_url(url: str) -> str:
    """http(s) with a host (and a valid port, if any); errors show the URL with its secrets masked."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as exc:
        raise ValueError(f"{redact(url)!r}: {exc}") from None
    if parts.scheme not in SCHEME_PORTS or not parts.hostname:
        raise ValueError(f"{redact(url)!r} is not an http:// or https:// URL with a host")
    return url


def _engine_kind(name: str) -> str:
    if name != "auto" and enginekinds.named(name) is None:
        raise ValueError(f"unknown engine kind {name!r}: one of auto, {', '.join(enginekinds.names())}")
    return name


def _canary_api(name: str) -> str:
    if name not in ("auto", "off") and name not in enginekinds.canary_apis():
        raise ValueError(f"unknown canary API {name!r}: one of auto, {', '.join(enginekinds.canary_apis())}, off")
    return name


RESTARTABLE = ("unit", "docker")  # target kinds whose supervisor gpuwarden can ask to start the engine again
MAX_KEY_BYTES = 4096


def api_key(path: Path) -> Secret:
    """The API key a canary sends, from `path`: a regular file of gpuwarden's own user (root, as a service) that
    no one else may read or write. Read at each canary (a key rotated is picked up); never in the TOML, and no
    error says it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO put there must not block
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise ValueError(f"{path} belongs to uid {st.st_uid}: only gpuwarden's own user (uid {os.geteuid()}) "
                             "may hold its key")
        if st.st_mode & 0o077:
            raise ValueError(f"{path} is open to others (mode {stat.S_IMODE(st.st_mode):o}): an API key must be "
                             f"readable only by its owner (chmod 600 {path})")
        data = os.read(fd, MAX_KEY_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    key = data.decode("utf-8", "replace").strip()
    if len(data) > MAX_KEY_BYTES or not key or "\n" in key:
        raise ValueError(f"{path} does not hold one API key (one line, at most {MAX_KEY_BYTES} bytes)")
    return Secret(key)


def _key_file(path: Path | None) -> Path | None:
    if path is not None:
        api_key(path)  # read now: `run` must not be the first to find it unreadable or open to others
    return path


_CREDENTIALS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"})


def _headers(value: dict[str, str]) -> dict[str, str]:
    for name in value:
        if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name):
            raise ValueError(f"{name!r} is not an HTTP header name")
        if name.lower() in _CREDENTIALS:  # the TOML is readable, and `check` prints it
            raise ValueError(f"{name!r} carries a credential: put the key in canary_api_key_file (a file readable "
                             "only by root), not in the TOML")
    return value


def _route(value: str) -> str:
    if not value.startswith("/") or any(c in value for c in "?#") or any(c.isspace() for c in value):
        raise ValueError(f"{value!r} is not a path such as \"/v1/completions\" or \"/v1/chat/completions\"")
    return value


def _masked(url: str | None) -> str | None:
    return url and redact(url)  # `check` prints the configuration: never the credentials in it


MetricsUrl = then(text, check_metrics_url)


def _engine_name(name: str) -> str:
    if not name.strip():  # pages, metrics, tags and `gpuwarden events --engine` all call it by this name
        raise ValueError("an engine needs a name (pages, metrics and tags call it by it), not an empty one")
    if name != name.strip() or "," in name:  # an incident's label lists its engines "a,b"
        raise ValueError(f"{name!r}: a name has no blanks at its ends and no comma")
    return name


class EngineConfig(Section):
    name: str = field(then(text, _engine_name))
    # the engine's API (canary, /slots); metrics_url defaults to its /metrics. Without it, metrics_url's scheme,
    # host and port are the API
    url: str | None = field(MetricsUrl, None, shown=_masked)
    metrics_url: str = field(MetricsUrl, shown=_masked)
    profile: str = field(then(text, _engine_kind), "auto")  # an engine kind (gpuwarden/enginekinds)
    # where progress is read: the engine's /metrics, its own log (log_file, log_unit or log_container), or
    # llama.cpp's /slots
    source: str = field(one_of("metrics", "log", "slots"), "metrics")
    log_file: Path | None = field(LogFile, None)
    log_unit: str | None = field(text, None)  # a systemd unit: its journal entries (_SYSTEMD_UNIT)
    log_container: str | None = field(ContainerName, None)  # a Docker container: its log through the Engine API
    # one real one-token completion: before a kill decided from a log alone, and every canary_interval (0: never)
    # while the engine is idle; the API it speaks (auto: from the profile)
    canary: str = field(then(text, _canary_api), "auto")
    canary_interval: float = field(Duration, 0.0)
    canary_timeout: float = field(Interval, 30.0)
    # what the canary sends as a client does: the engine's API key (Authorization: Bearer) from a file readable
    # only by root (else: `--api-key` from the engine's own command line), extra headers (no credential), and to
    # ask through an OpenAI-compatible route, the model and the route
    canary_api_key_file: Path | None = field(AbsolutePath, None, check=_key_file)
    canary_headers: dict[str, str] = field(DictOf(text, text), {}, check=_headers)
    canary_model: str | None = field(text, None)
    canary_route: str | None = field(then(text, _route), None)
    gpus: list[str] = field(ListOf(PciAddress), [])  # PCI addresses; empty: learned from the device files it holds
    scrape_interval: float = field(Interval, 5.0)
    # the whole scrape: connect, every byte of the body, and the parse; never above scrape_interval
    scrape_timeout: float = field(then(Interval, _at_most(300.0)), 5.0)
    max_body_bytes: int = field(integer(ge=1024), 8 << 20)
    stall_multiple: float = field(number(gt=0), 4.0)
    min_stall: float = field(then(parse_duration, _at_least(1.0, "shorter, one slow scrape would be a stall and a "
                                                                 "kill")), 30.0)
    max_stall: float = field(Interval, 1800.0)
    unresponsive_after: int = field(integer(ge=1), 3)  # failed scrapes in a row, process alive
    crash_loop_exits: int = field(integer(ge=2), 3)
    crash_loop_window: float = field(Period, 600.0)
    # restart: kill, then start it again through what supervises it (target kind "unit" or "docker")
    on_stall: str = field(one_of("kill", "restart", "alert"), "kill")
    on_gpu_fault: str = field(one_of("kill", "restart", "alert"), "kill")
    # /metrics hanging for the stall threshold while the processes live: kill when requests were running at its
    # last answer (as stuck as a stall), alert when it was idle
    on_unresponsive: str = field(one_of("kill", "restart", "alert"), "kill")
    # a restarted (or re-started) engine not back, a real completion returned, by then: engine_restart_failed.
    # Big models load for minutes
    restart_timeout: float = field(Interval, 600.0)
    kill_grace: float = field(Duration, 10.0)
    kill_budget: int = field(integer(ge=0), 3)
    kill_budget_window: float = field(Period, 3600.0)
    max_kill_processes: int = field(integer(ge=1), 512)  # a target that resolves to more: kill_refused
    dry_run: bool = field(boolean, False)
    target: EngineTarget = field(EngineTarget, factory=EngineTarget)

    @classmethod
    def prepare(cls, data: dict[str, Any]) -> dict[str, Any]:
        """An engine without /metrics (source "log" or "slots") is named by its API alone."""
        if "metrics_url" in data:
            return data
        if "url" not in data:
            raise ValueError("an engine needs metrics_url, or url (its API) when it serves no /metrics")
        if isinstance(data["url"], str):
            return {**data, "metrics_url": data["url"].rstrip("/") + "/metrics"}
        return data

    def verify(self) -> None:
        if self.min_stall > self.max_stall:
            raise ValueError(f"min_stall ({_show(self.min_stall)}) is above max_stall ({_show(self.max_stall)})")
        self._restartable()
        logs = [key for key in ("log_file", "log_unit", "log_container") if getattr(self, key) is not None]
        if self.source == "log" and len(logs) != 1:
            raise ValueError(f"source \"log\" needs exactly one of log_file, log_unit and log_container"
                             f"{' (not ' + ' and '.join(logs) + ')' if logs else ''}")
        if self.source == "log" and self.log_unit is not None and not journal_readable():
            raise ValueError(f"log_unit (the unit's journal) {NEEDS_JOURNAL}; or log_file")
        kind = enginekinds.named(self.profile)
        if kind and self.source not in kind.sources:
            raise ValueError(f"{kind.title} offers no source {self.source!r}: use " +
                             " or ".join(f'source = "{s}"' for s in kind.sources))

    def _restartable(self) -> None:
        """A restart goes through what supervises the engine: gpuwarden starts nothing itself."""
        for key in ("on_stall", "on_gpu_fault", "on_unresponsive"):
            if getattr(self, key) != "restart":
                continue
            if self.target.kind not in RESTARTABLE:
                raise ValueError(f'{key} = "restart" needs an engine that systemd or Docker supervises: target kind '
                                 f'"unit" or "docker", not {self.target.kind!r}. For an engine nothing supervises, '
                                 f'use "kill" and run it under systemd with Restart=always (docs/restart.md)')
            if self.canary == "off":
                raise ValueError(f'{key} = "restart" needs the canary: an engine is back only when a real '
                                 'completion returns (canary = "off" cannot tell)')


class EnginesConfig(Section):
    discover: bool = field(boolean, True)  # with no [[engine]]: find running engine servers and watch them
    discover_interval: float = field(Period, 30.0)
    max_discovered: int = field(integer(ge=1, le=1024), 16)  # discovered engines watched (and probed a round)


class GpuConfig(Section):
    sysfs_root: Path = field(AbsolutePath, Path("/sys"))  # where GPUs are found, read and guarded
    interval: float = field(Interval, 1.0)
    read_deadline: float = field(Interval, 3.0)  # a read that takes longer: gpu_unresponsive, and it is abandoned
    recorder_window: float = field(Duration, 900.0)  # telemetry kept in memory for incident reports
    nvml: bool = field(boolean, True)  # read NVIDIA GPUs through NVML when its library is there
    edge_warn_celsius: float = field(Number, 90.0)
    edge_critical_celsius: float = field(Number, 100.0)
    junction_warn_celsius: float = field(Number, 100.0)
    junction_critical_celsius: float = field(Number, 110.0)
    mem_warn_celsius: float = field(Number, 95.0)
    mem_critical_celsius: float = field(Number, 105.0)
    power_over_cap_ratio: float = field(Number, 1.05)  # power above cap x this
    power_spike_watts: float = field(Number, 200.0)  # a jump this big between two samples
    psu_guard_watts: float | None = field(Number, None)  # all GPUs together above this
    fan_hot_celsius: float = field(Number, 70.0)  # fan at 0 while the hottest sensor is above this
    clock_low_ratio: float = field(Number, 0.5)  # sclk below this share of its maximum while busy
    busy_ratio: float = field(Number, 0.8)  # "under load"
    asymmetry_power_cap_watts: float = field(Number, 5.0)
    asymmetry_clock_ratio: float = field(Number, 0.15)


class GuardConfig(Section):
    enabled: bool | None = field(boolean, None)  # default: on when running as root
    devices: list[str] = field(ListOf(PciAddress), [])  # PCI addresses; replaces the discovered GPUs when set
    verify_interval: float = field(Interval, 10.0)


class CacheConfig(Section):
    # compile caches to watch; default: the usual ones of root and login users
    dirs: list[Path] | None = field(ListOf(AbsolutePath), None)
    on_crash_loop: str = field(one_of("quarantine", "alert"), "quarantine")
    dry_run: bool = field(boolean, False)  # say what would be moved, move nothing


def _unique_names(value: list[EngineConfig]) -> list[EngineConfig]:
    names = [e.name for e in value]
    for name in names:
        if (n := names.count(name)) > 1:
            raise ValueError(f"engine name {name!r} is used {'twice' if n == 2 else f'{n} times'}")
    return value


class Config(Section):
    daemon: DaemonConfig = field(DaemonConfig, factory=DaemonConfig)
    exporter: ExporterConfig = field(ExporterConfig, factory=ExporterConfig)
    kernel: KernelConfig = field(KernelConfig, factory=KernelConfig)
    alerts: AlertsConfig = field(AlertsConfig, factory=AlertsConfig)
    engines: EnginesConfig = field(EnginesConfig, factory=EnginesConfig)
    engine: list[EngineConfig] = field(ListOf(EngineConfig), [], check=_unique_names)
    gpu: GpuConfig = field(GpuConfig, factory=GpuConfig)
    guard: GuardConfig = field(GuardConfig, factory=GuardConfig)
    cache: CacheConfig = field(CacheConfig, factory=CacheConfig)


def load(path: Path | None) -> tuple[Config, Path | None]:
    """The config at `path`, or at the default path, or the built-in defaults when no file is there.

    Returns the config and the file it came from (None for built-in defaults).
    """
    explicit = path is not None
    path = path or DEFAULT_PATH
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"{path}: no such file") from None
        return Config(), None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    return parse(text, str(path)), path


def parse(text: str, name: str = "<config>") -> Config:
    text = text.removeprefix("\ufeff")  # a byte-order mark, as Windows editors write: not part of the TOML
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(_toml_error(exc, name)) from None
    try:
        config = Config.validate(data)
    except Invalid as exc:
        raise ConfigError(_in_line_order(exc.problems, text, name)) from None
    if problems := list(cross_checks(config)):
        raise ConfigError(_in_line_order(problems, text, name))
    return config


def _in_line_order(problems: list[tuple[tuple[Any, ...], str]], text: str, name: str) -> str:
    """Each problem as `file:line: key: why`, top to bottom as an editor shows the file (those with no line of
    their own, keys left to their defaults, last)."""
    lines = [line_of(text, loc) for loc, _ in problems]
    order = sorted(range(len(problems)), key=lambda i: (lines[i] is None, lines[i] or 0))
    return "\n".join(_located(problems[i][0], problems[i][1], text, name, lines[i]) for i in order)


_TOML_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")


def _toml_error(exc: tomllib.TOMLDecodeError, name: str) -> str:
    """`file:line: not valid TOML: ...`, the form every other error of `check` has (and editors jump to)."""
    text = str(exc)
    if m := _TOML_AT.search(text):
        return f"{name}:{m.group(1)}: not valid TOML: {text[:m.start()]} (column {m.group(2)})"
    return f"{name}: not valid TOML: {text}"


_THRESHOLDS = ("edge", "junction", "mem")


def cross_checks(config: Config) -> Iterator[tuple[tuple[Any, ...], str]]:
    """(key, why) for each value that passes its own type but breaks `run` beside another: checked once the
    whole file parsed, so that each names its own key's line."""
    engines = [e.name for e in config.engine]
    for i, target in enumerate(config.alerts.target):
        for j, tag in enumerate(target.tags):
            if (pci := _pci_or_none(tag)) is not None and pci != tag:
                yield ("alerts", "target", i, "tags", j), f"write the GPU {tag!r} as alerts name it: {pci!r}"
            elif pci is None and not _known_tag(tag, engines):
                yield (("alerts", "target", i, "tags", j),
                       f"unknown tag {tag!r}" + hint(tag, [*KINDS, *engines, "host"])
                       + ": a tag is an event kind, a GPU's PCI address, an engine's name or \"host\"; this one "
                         "matches no alert, so this target would never be sent one")
    for i, e in enumerate(config.engine):
        if "scrape_timeout" in e.fields_set and e.scrape_timeout > e.scrape_interval:
            yield (("engine", i, "scrape_timeout"), f"scrape_timeout ({_show(e.scrape_timeout)}) is above "
                   f"scrape_interval ({_show(e.scrape_interval)}): a scrape would outlast its turn")
    for part in _THRESHOLDS:
        warn, critical = f"{part}_warn_celsius", f"{part}_critical_celsius"
        if getattr(config.gpu, warn) > getattr(config.gpu, critical):
            yield (("gpu", warn), f"{warn} ({getattr(config.gpu, warn):g}) is above {critical} "
                   f"({getattr(config.gpu, critical):g}): the warning would never come first")
    if why := _not_a_folder(config.daemon.state_dir):
        yield ("daemon", "state_dir"), why


def _known_tag(tag: str, engines: list[str]) -> bool:
    discovered = re.fullmatch(r"(\w+)-\d{1,5}", tag)  # a discovered engine's name: its kind, its port
    return tag in KINDS or tag in engines or tag == "host" or bool(discovered and enginekinds.named(discovered[1]))


def _pci_or_none(tag: str) -> str | None:
    try:
        return normalize_pci(tag)
    except ValueError:
        return None


def _not_a_folder(path: Path) -> str | None:
    """Why `run` could not make or use `path` as a folder: it, or the nearest existing folder above it, is not
    one. None when it is (or can be made)."""
    for part in (path, *path.parents):
        try:
            if part.exists() or part.is_symlink():
                return None if part.is_dir() else f"{part} is not a folder" + ("" if part == path else
                                                                               f" (it is above {path})")
        except OSError as exc:
            return f"{part}: {exc.strerror or exc}"
    return None


def in_line_order(problems: list[tuple[tuple[Any, ...], str]], path: Path | None) -> list[str]:
    """Problems found after parsing (check's warnings) as `file:line: key: why`, in the file's order."""
    try:
        text = path.read_text(encoding="utf-8").removeprefix("\ufeff") if path else ""
    except (OSError, UnicodeDecodeError):
        text = ""
    return _in_line_order(problems, text, str(path or "<defaults>")).splitlines() if problems else []


def _located(loc: tuple[Any, ...], message: str, text: str, name: str, line: int | None = None) -> str:
    key = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc).replace(".[", "[")
    line = line or line_of(text, loc)
    return f"{name}:{line}: {key}: {message}" if line else f"{name}: {key}: {message}"


def placed(exc: ConfigError, path: Path | None) -> ConfigError:
    """`exc` with the file and line of its key, for an error found after parsing."""
    try:
        line = line_of(path.read_text(encoding="utf-8"), exc.loc) if path and exc.loc else None
    except (OSError, UnicodeDecodeError):
        line = None
    return ConfigError(f"{path}:{line}: {exc}", exc.loc) if line else exc


_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_\-.\"' ]+?)\s*=")


def line_of(text: str, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line in TOML `text` that defines the key at `loc`, or its closest enclosing table."""
    want = [str(p) for p in loc]
    best, best_len, first = None, 0, None
    table: list[str] = []
    array_counts: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if m := _HEADER.match(line):
            parts = _split_key(m.group(2))
            if m.group(1) == "[[":
                name = ".".join(parts)
                array_counts[name] = array_counts.get(name, -1) + 1
                parts = [*parts, str(array_counts[name])]
            else:
                parts = _in_latest(parts, array_counts)
            table = parts
            path = table
        elif m := _KEY.match(line):
            path = table + _split_key(m.group(1))
        else:
            continue
        n = len(path)
        if n > best_len and want[:n] == path:
            best, best_len = lineno, n
            if n == len(want):
                break
        elif first is None and path[:len(want)] == want:  # an array of tables as a whole: its first entry
            first = lineno
    return best or first


def _in_latest(parts: list[str], array_counts: dict[str, int]) -> list[str]:
    """A sub-table's path with the index of each array of tables it is in: [engine.target] belongs to the
    latest [[engine]]."""
    out = []
    for i, part in enumerate(parts):
        out.append(part)
        name = ".".join(parts[:i + 1])
        if i < len(parts) - 1 and name in array_counts:
            out.append(str(array_counts[name]))
    return out


def _split_key(key: str) -> list[str]:
    return [part.strip().strip("\"'") for part in key.split(".")]
