"""The Alertmanager channel: each alert identity of a message POSTed to an Alertmanager's `/api/v2/alerts`,
labelled alertname (the event kind), severity, host, gpu, engine and incident; an all-clear sets `endsAt`, so
the alert resolves there. Alertmanager groups, silences, inhibits and routes from these labels.

`alertmanager://host:port` speaks HTTP, `alertmanagers://host:port` HTTPS; `user:password@` is sent as basic
auth; a path is a prefix (an Alertmanager behind `--web.route-prefix`). gpuwarden sends an alert when it
fires and when it ends, not again in between: Alertmanager resolves one by itself after its `resolve_timeout`
(5 m by default), so a long incident wants a longer one there (docs/alerts.md).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import SplitResult, urlsplit

from gpuwarden.alert.channel import Alert

SCHEMES = {"alertmanager": "http", "alertmanagers": "https"}


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


def _rfc3339(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class AlertmanagerChannel:
    takes_pictures = False  # the API carries labels and annotations, no file

    def __init__(self, url: str) -> None:
        import httpx  # noqa: F401  (loaded as the target is built, at start: `run` without one never loads it)

        self.url, self.auth = endpoint(url)

    async def notify(self, alert: Alert, timeout: float) -> tuple[bool, str | None]:
        """Alertmanager's answer decides: 2xx done; 4xx (a body it refuses) would be refused again, so no
        retry, except 408 and 429; 5xx, no connection or no answer: retry."""
        import httpx  # loaded by __init__: no import on the event loop

        body = postable(alert, time.time())
        if not body:
            return False, None  # a message about no event (a count of repeats): nothing to fire or end
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
