"""The Alertmanager channel: each alert identity of a message POSTed to an Alertmanager's `/api/v2/alerts`,
labelled alertname (the event kind), severity, host, gpu, engine and incident; an all-clear sets `endsAt`, so
the alert resolves there. Alertmanager groups, silences, inhibits and routes from these labels.

`alertmanager://host:port` speaks HTTP, `alertmanagers://host:port` HTTPS; `user:password@` is sent as basic
auth; a path is a prefix (an Alertmanager behind `--web.route-prefix`).

Alertmanager resolves an alert by itself `resolve_timeout` (5 m by default) after it was last sent, so, as its own
clients do at each evaluation, the channel sends again every `[alerts] alertmanager_resend` (1 m) what is still
firing: the alerts of the incidents still open (`Firing`, pure), until their all-clear, or until their incident
closes without one (then they end with `endsAt` too). An alert outside an incident is sent once and expires.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import SplitResult, urlsplit

from gpuwarden.alert.channel import Alert

SCHEMES = {"alertmanager": "http", "alertmanagers": "https"}
RESEND = 60.0  # Prometheus' default evaluation interval; well below Alertmanager's default resolve_timeout (5 m)


def endpoint(url: str) -> tuple[str, tuple[str, str] | None]:
    """`alertmanager://u:p@host:9093/am` -> ("http://host:9093/am/api/v2/alerts", ("u", "p")); ValueError
    saying what is wrong otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ValueError(f"not an Alertmanager URL (scheme {parts.scheme!r}, expected {' or '.join(SCHEMES)})")
    if not parts.hostname:
        raise ValueError("an Alertmanager URL needs a host: alertmanager://host:9093")
    port = _port(parts)
    if parts.query or parts.fragment:
        raise ValueError("an Alertmanager URL takes no query or fragment")
    auth = (parts.username or "", parts.password or "") if parts.username else None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    base = f"{SCHEMES[parts.scheme]}://{host}" + (f":{port}" if port else "") + parts.path.rstrip("/")
    return base + "/api/v2/alerts", auth


def _port(parts: SplitResult) -> int | None:
    try:
        return parts.port
    except ValueError:
        raise ValueError(f"port {parts.netloc.rsplit(':', 1)[-1]!r} is not a port number") from None


def postable(alert: Alert, now: float) -> list[dict[str, Any]]:
    """The body of POST /api/v2/alerts: the identities, annotated with the message, ended when it resolves."""
    out = []
    for identity in alert.identities:
        item = {"labels": identity["labels"], "startsAt": _rfc3339(identity["starts"]),
                "annotations": {"summary": alert.title, "description": alert.text}}
        if alert.resolved:
            item["endsAt"] = _rfc3339(max(now, identity["starts"]))
        out.append(item)
    return out


class Firing:
    """The alerts a target holds firing, pure: each one posted as firing and held open (`identity["held"]`),
    until an all-clear ends it. `due` is the body to send again every `every` seconds: the firing alerts as last
    posted, and, with `endsAt`, those whose incident closed without an all-clear (gone once sent)."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.items: dict[tuple, dict[str, Any]] = {}  # label set -> the alert as last posted
        self.next: float | None = None  # when to send again; None: nothing held

    def posted(self, alert: Alert, body: list[dict[str, Any]], now: float) -> None:
        for identity, item in zip(alert.identities, body, strict=True):
            key = tuple(sorted(item["labels"].items()))
            if alert.resolved:
                self.items.pop(key, None)
            elif identity.get("held"):
                self.items[key] = item
        if self.items and self.next is None:
            self.next = now + self.every
        elif not self.items:
            self.next = None

    def due(self, now: float, still_open: Callable[[str], bool]) -> list[dict[str, Any]]:
        if self.next is None or now < self.next:
            return []
        body = []
        for item in self.items.values():
            incident = item["labels"].get("incident")
            closed = incident is not None and not still_open(incident)
            body.append({**item, "endsAt": _rfc3339(now)} if closed else item)
        return body

    def adopt(self, items: dict[tuple, dict[str, Any]], due: float) -> None:
        """Alerts held elsewhere (a reload's earlier channel), sent again by `due` at the latest."""
        self.items.update(items)
        if self.items:
            self.next = min(self.next if self.next is not None else due, due)

    def sent(self, body: list[dict[str, Any]], now: float) -> None:
        """`body` went out (or failed: then it is tried again at the next interval, as a whole)."""
        for item in body:
            if "endsAt" in item:
                self.items.pop(tuple(sorted(item["labels"].items())), None)
        self.next = now + self.every if self.items else None


def _rfc3339(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class AlertmanagerChannel:
    takes_pictures = False  # the API carries labels and annotations, no file

    def __init__(self, url: str, resend: float = RESEND) -> None:
        import httpx  # noqa: F401  (loaded as the target is built, at start: `run` without one never loads it)

        self.url, self.auth = endpoint(url)
        self.firing = Firing(resend)

    async def notify(self, alert: Alert, timeout: float) -> tuple[bool, str | None]:
        """Alertmanager's answer decides: 2xx done; 4xx (a body it refuses) would be refused again, so no
        retry, except 408 and 429; 5xx, no connection or no answer: retry."""
        now = time.time()
        body = postable(alert, now)
        if not body:
            return False, None  # a message about no event (a count of repeats): nothing to fire or end
        retry, error = await self._post(body, timeout)
        if error is None:
            self.firing.posted(alert, body, now)
        return retry, error

    async def refresh(self, timeout: float, still_open: Callable[[str], bool]) -> tuple[bool, str | None]:
        now = time.time()
        body = self.firing.due(now, still_open)
        if not body:
            return False, None
        retry, error = await self._post(body, timeout)
        self.firing.sent(body if error is None else [], now)
        return retry, error

    def resume(self, alert: Alert) -> None:
        now = time.time()
        self.firing.posted(alert, postable(alert, now), now)
        self.firing.adopt({}, now)  # said again at once: it may have expired while gpuwarden was away

    def carry(self, earlier: object) -> None:
        if isinstance(earlier, AlertmanagerChannel) and earlier.url == self.url:
            self.firing.adopt(earlier.firing.items, earlier.firing.next or time.time())

    async def _post(self, body: list[dict[str, Any]], timeout: float) -> tuple[bool, str | None]:
        import httpx  # loaded by __init__: no import on the event loop

        try:
            async with asyncio.timeout(timeout + 5), httpx.AsyncClient(timeout=timeout, auth=self.auth) as client:
                response = await client.post(self.url, json=body)
        except TimeoutError:
            return True, f"no answer within {timeout + 5:.0f} s"
        except httpx.HTTPError as exc:
            return True, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if response.is_success:
            return False, None
        said = f"Alertmanager answered {response.status_code}: {response.text.strip()[:200]}"
        return response.status_code >= 500 or response.status_code in (408, 429), said
