"""The apprise channel: one apprise object (one URL or one service of an apprise config file) per target. A
message is sent once: nothing to re-send, resume or carry over."""

from __future__ import annotations

import logging
from collections.abc import Callable

import apprise

from gpuwarden.alert.channel import Alert
from gpuwarden.offloop import Busy, OffLoop

_FORMATS = {True: apprise.NotifyFormat.MARKDOWN, False: apprise.NotifyFormat.TEXT}
_SENDS = OffLoop("apprise", limit=16)  # one send in flight per target; a hung one holds one thread, not more


class AppriseChannel:
    def __init__(self, name: str, obj: apprise.Apprise) -> None:
        self.name, self.apprise = name, obj  # the name keys the off-loop slot: one send per target at a time

    @property
    def takes_pictures(self) -> bool:
        return all(getattr(server, "attachment_support", False) for server in self.apprise)

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
        markdown = self.markdown

        def notify():
            return self.apprise.notify(body=alert.body if markdown else alert.text, title=alert.title,
                                       notify_type=alert.tone, body_format=_FORMATS[markdown], timeout=timeout,
                                       attach=alert.picture, log_level=logging.WARNING,
                                       log_callback=lambda entry, _: said.append(str(entry.message)))
        try:
            result = await _SENDS.run(self.name, timeout + 5, notify)
        except TimeoutError:
            return True, f"no answer within {timeout + 5:.0f} s"
        except Busy as exc:
            return True, str(exc)
        if result:
            return False, None
        status = getattr(getattr(result, "status", None), "name", "FAILURE").lower()
        return True, "; ".join(dict.fromkeys(said)) or f"apprise reported {status} without saying why"

    async def refresh(self, timeout: float, still_open: Callable[[str], bool]) -> tuple[bool, str | None]:
        return False, None

    def resume(self, alert: Alert) -> None:
        pass

    def carry(self, earlier: object) -> None:
        pass
