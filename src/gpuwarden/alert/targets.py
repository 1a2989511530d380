"""Alert targets from the config: one channel each (a registered channel for its URL schemes, Alertmanager for
`alertmanager://`; apprise for the rest), a name safe to log, a severity floor, tags."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.alert.alertmanager import SCHEMES, AlertmanagerChannel
from gpuwarden.alert.channel import Channel
from gpuwarden.config.settings import AlertsConfig, ConfigError
from gpuwarden.core.model import Severity

# The channels besides apprise, by the URL schemes each serves. Adding one is a module implementing
# alert/channel.Channel and one registration line below. Its maker takes (url, target name, resend seconds), and
# raises ValueError saying what is wrong with a URL of its scheme (`check` shows it at the URL's key).
# Every other scheme is apprise's.
Maker = Callable[[str, str, float], Channel]
_CHANNELS: dict[str, Maker] = {}


def register(schemes: Iterable[str], make: Maker) -> None:
    for scheme in schemes:
        if scheme in _CHANNELS:
            raise ValueError(f"a channel for {scheme}:// is registered already")
        _CHANNELS[scheme] = make


def unregister(schemes: Iterable[str]) -> None:
    """For a test's own channel: the built-in ones stay."""
    for scheme in schemes:
        del _CHANNELS[scheme]


register(SCHEMES, lambda url, name, resend: AlertmanagerChannel(url, resend))


@dataclass(frozen=True, eq=False, repr=False)
class Target:
    """One alert destination: its channel and which alerts it wants."""

    name: str  # never holds a secret: it goes into logs and metric labels
    channel: Channel
    min_severity: Severity
    tags: frozenset[str]

    def wants(self, severity: Severity, tags: frozenset[str]) -> bool:
        return severity >= self.min_severity and (not self.tags or bool(self.tags & tags))


def safe_name(index: int, url: str) -> str:
    """`2:ntfys://ntfy.example.org`: scheme and host only; user, password, token, path and query dropped.

    Many schemes put a secret where the host goes (`ntfy://{topic}`, `discord://{webhook_id}/...`), so the
    host is kept only when it looks like one: with a dot in it, or localhost.
    """
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if "." not in host and host != "localhost":
        return f"{index}:{parts.scheme}"
    return f"{index}:{parts.scheme}://{host}" + (f":{parts.port}" if _port(parts) else "")


def _port(parts: urllib.parse.SplitResult) -> int | None:
    try:
        return parts.port
    except ValueError:
        return None


def build(config: AlertsConfig) -> list[Target]:
    specs = [(u.get_secret_value(), None, "warning", (), ("alerts", "urls", i)) for i, u in enumerate(config.urls)]
    specs += [(t.url.get_secret_value(), t.name, t.min_severity, tuple(t.tags), ("alerts", "target", i, "url"))
              for i, t in enumerate(config.target)]
    targets = []
    for index, (url, name, severity, tags, loc) in enumerate(specs, 1):
        name = name or safe_name(index, url)
        targets.append(Target(name, _channel(url, name, loc, config.alertmanager_resend), Severity.parse(severity),
                              frozenset(tags)))
    if config.config_file:
        targets += _from_apprise_config(config.config_file, Severity.parse(config.config_file_min_severity),
                                        start=len(targets) + 1)
    return targets


def _channel(url: str, name: str, loc: tuple, resend: float) -> Channel:
    """The channel a URL names: its scheme picks it, as apprise's own schemes do."""
    key = ".".join(f"[{p}]" if isinstance(p, int) else p for p in loc).replace(".[", "[")
    if make := _CHANNELS.get(urllib.parse.urlsplit(url).scheme):
        try:
            return make(url, name, resend)
        except ValueError as exc:
            raise ConfigError(f"{key}: {exc} ({name})", loc) from None
    import apprise  # here, not at the top: 130 ms and 10 MB that a box without apprise targets never needs

    from gpuwarden.alert.apprise_channel import AppriseChannel

    obj = apprise.Apprise()
    if not obj.add(url):
        raise ConfigError(f"{key}: {_refused(url)}", loc)
    return AppriseChannel(name, obj)


def _refused(url: str) -> str:
    """Why apprise refused the URL, in words (apprise itself says nothing): a scheme it has no service for, or a
    service whose URL's form is wrong. Never the URL: it holds secrets."""
    from apprise.manager_plugins import NotificationManager

    from gpuwarden.config.schema import hint

    services, scheme = NotificationManager(), urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in services:
        return (f"apprise has no service for {scheme}://{hint(scheme, services.schemas())}; its services and their "
                "URLs: https://appriseit.com/services/")
    service = services[scheme]
    return (f"apprise's {getattr(service, 'service_name', scheme)} service ({scheme}://) does not accept this URL: "
            f"a part is missing or malformed (its form: {getattr(service, 'setup_url', None) or 'apprise wiki'})")


def _from_apprise_config(path: Path, severity: Severity, start: int) -> list[Target]:
    if not path.is_file():
        raise ConfigError(f"alerts.config_file: {path}: no such file", ("alerts", "config_file"))
    import apprise

    from gpuwarden.alert.apprise_channel import AppriseChannel

    cfg = apprise.AppriseConfig()
    if not cfg.add(str(path)):
        raise ConfigError(f"alerts.config_file: {path}: apprise cannot read it", ("alerts", "config_file"))
    targets = []
    for index, service in enumerate(cfg.services(), start):  # apprise 2 (1.x called it servers())
        obj = apprise.Apprise()
        obj.add(service)
        name = safe_name(index, service.url())
        targets.append(Target(name, AppriseChannel(name, obj), severity, frozenset(str(tag) for tag in service.tags)))
    if not targets:
        raise ConfigError(f"alerts.config_file: {path}: no usable URL in it", ("alerts", "config_file"))
    return targets
