"""The apprise channel: one apprise object (one URL or one service of an apprise config file) per target. A
message is sent once: nothing to re-send, resume or carry over.

Each message rings as urgently as it is: its tone sets the service's own urgency (ntfy's priority and tags,
Pushover's and Gotify's priority), unless the target's URL sets one itself. The incident's picture goes as an SVG
to a service that shows it as a file (e-mail, webhooks), and as a PNG to ntfy (a phone shows no SVG): there the
message goes first, in the JSON body as without a picture, then the picture alone in a second post at low
priority (it does not ring again). ntfy given a file and a message in one post puts the message in the URL's
query, where proxies log it."""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import apprise

from gpuwarden.alert.channel import Alert
from gpuwarden.runtime.offloop import Busy, OffLoop
from gpuwarden.store import timeline

log = logging.getLogger(__name__)

_FORMATS = {True: apprise.NotifyFormat.MARKDOWN, False: apprise.NotifyFormat.TEXT}
_SENDS = OffLoop("apprise", limit=16)  # one send in flight per target; a hung one holds one thread, not more
# each service's urgency per tone (failure: a critical page), as URL parameters of its own: ntfy's "max" rings
# through Do Not Disturb, Pushover's and Gotify's "high" through quiet hours; an all-clear is normal
_URGENCY: dict[str, dict[str, dict[str, str]]] = {
    "NotifyNtfy": {"failure": {"priority": "max", "tags": "rotating_light"},
                   "warning": {"priority": "high", "tags": "warning"},
                   "info": {"priority": "low", "tags": "information_source"},
                   "success": {"priority": "default", "tags": "white_check_mark"}},
    "NotifyPushover": {"failure": {"priority": "high"}, "warning": {"priority": "normal"},
                       "info": {"priority": "low"}, "success": {"priority": "normal"}},
    "NotifyGotify": {"failure": {"priority": "high"}, "warning": {"priority": "normal"},
                     "info": {"priority": "low"}, "success": {"priority": "normal"}},
}
_DEFAULT_URGENCY = {"priority": ("default", "normal", "0", "5"), "tags": ("",), "xtags": ("",)}  # as apprise writes
# the picture each service shows its reader: an SVG file (a mail client, a webhook's receiver), or a PNG (ntfy's
# app previews an image attachment, not an SVG)
_PICTURES = {"NotifyEmail": "svg", "NotifyJSON": "svg", "NotifyXML": "svg", "NotifyForm": "svg", "NotifyNtfy": "png"}


class AppriseChannel:
    def __init__(self, name: str, obj: apprise.Apprise) -> None:
        self.name, self.apprise = name, obj  # the name keys the off-loop slot: one send per target at a time
        self._tones = {tone: _urgent(obj, tone) for tone in ("failure", "warning", "info", "success")}
        shown = {_PICTURES.get(type(s).__name__) if getattr(s, "attachment_support", False) else None for s in obj}
        self._picture = shown.pop() if len(shown) == 1 else None  # "svg", "png", or None: no picture
        self._quiet = _with(obj, {"priority": "low"}) if self._picture == "png" else None  # the PNG's own post

    @property
    def takes_pictures(self) -> bool:
        return self._picture is not None

    @property
    def markdown(self) -> bool:
        """Whether every service of the target renders Markdown (or HTML, which apprise makes from it): apprise
        converts no Markdown to plain text, so a plain-text service gets the message's plain text instead."""
        return all(server.resolve_format(apprise.NotifyFormat.MARKDOWN) != apprise.NotifyFormat.TEXT
                   for server in self.apprise)

    async def notify(self, alert: Alert, timeout: float) -> tuple[bool, str | None]:
        """apprise says only failed or not, never why in a form to act on: every failure is worth a retry.
        The whole send (every retry and attachment of apprise's) ends within `timeout` + 5 s; while an
        abandoned send of the target still runs, no other starts."""
        said: list[str] = []
        markdown, services = self.markdown, self._tones.get(alert.tone, self.apprise)
        picture = alert.picture if self._picture == "svg" else None

        def notify():
            return services.notify(body=alert.body if markdown else alert.text, title=alert.title,
                                   notify_type=alert.tone, body_format=_FORMATS[markdown], timeout=timeout,
                                   attach=picture, log_level=logging.WARNING,
                                   log_callback=lambda entry, _: said.append(str(entry.message)))
        try:
            result = await _SENDS.run(self.name, timeout + 5, notify)
        except TimeoutError:
            return True, f"no answer within {timeout + 5:.0f} s"
        except Busy as exc:
            return True, str(exc)
        if result:
            if self._picture == "png" and alert.picture:
                await self._png(alert, timeout)
            return False, None
        status = getattr(getattr(result, "status", None), "name", "FAILURE").lower()
        return True, "; ".join(dict.fromkeys(said)) or f"apprise reported {status} without saying why"

    async def _png(self, alert: Alert, timeout: float) -> None:
        """The picture as PNG, alone, after its message: no title nor text (the message has them, and they would
        go in the URL's query). Best effort: the message is delivered, so a picture that fails is logged, never
        a reason to send the message again."""
        def send():
            png = timeline.png(Path(alert.picture or ""), timeout)
            return png is None or self._quiet.notify(body="", title="", notify_type=alert.tone, attach=str(png),
                                                     timeout=timeout, log_level=logging.WARNING)
        try:
            if not await _SENDS.run(self.name, timeout + 5, send):
                log.warning("%s: the message went, its picture did not", self.name)
        except (TimeoutError, Busy) as exc:
            log.warning("%s: the message went, its picture did not: %s", self.name, exc or "no answer in time")

    async def refresh(self, timeout: float, still_open: Callable[[str], bool]) -> tuple[bool, str | None]:
        return False, None

    def resume(self, alert: Alert) -> None:
        pass

    def carry(self, earlier: object) -> None:
        pass


def _with(obj: apprise.Apprise, settings: dict[str, str]) -> apprise.Apprise:
    """The target's services with these URL parameters set (over the URL's own)."""
    out = apprise.Apprise()
    for server in obj:
        parts = urllib.parse.urlsplit(server.url(privacy=False))
        query = {**dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True)), **settings}
        variant = apprise.Apprise.instantiate(parts._replace(query=urllib.parse.urlencode(query)).geturl())
        out.add(variant if variant else server)
    return out


def _urgent(obj: apprise.Apprise, tone: str) -> apprise.Apprise:
    """The target's services as they send a message of this tone: each with its urgency for it, where the
    service has one and the target's URL left it at its default (a URL that sets it keeps it)."""
    urgent = apprise.Apprise()
    for server in obj:
        wanted = _URGENCY.get(type(server).__name__, {}).get(tone)
        url = server.url(privacy=False) if wanted else None
        if url is None:
            urgent.add(server)
            continue
        parts = urllib.parse.urlsplit(url)
        query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
        if "tags" in wanted and query.get("xtags", query.get("tags", "")):
            wanted = {k: v for k, v in wanted.items() if k != "tags"}  # the URL's own tags
        query.update({k: v for k, v in wanted.items() if query.get(k, "") in _DEFAULT_URGENCY[k]})
        variant = apprise.Apprise.instantiate(parts._replace(query=urllib.parse.urlencode(query)).geturl())
        urgent.add(variant if variant else server)  # a URL apprise would not take again: as configured
    return urgent
