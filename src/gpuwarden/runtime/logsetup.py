"""Logging: structured journal entries under systemd, readable lines on stderr otherwise; no secret in either."""

from __future__ import annotations

import logging
import os
import re
import sys

# Libraries that log every request (httpx: ~17,000 lines a day per engine) or, at debug, the URLs of alert
# targets with their tokens in the path: WARNING and above only, whatever log_level says.
QUIET = ("httpx", "httpcore", "apprise", "urllib3")

_URL = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@\s]*@)?(?P<rest>[^\s\"'<>]*)")
_QUERY_VALUE = re.compile(r"([?&;][^=&;#\s]*=)[^&;#\s]*")
# an engine's command line (a kill's target, described in events) carries its API key so
_KEY_FLAG = re.compile(r"(--api[-_]key(?:=|\s+))[^\s\"']+")


def redact(text: str) -> str:
    """`text` with the userinfo and the query values of every URL in it masked, and the value of an `--api-key`
    option: `http://u:p@h/m?api_key=k` -> `http://***@h/m?api_key=***`, `--api-key k` -> `--api-key ***`."""
    def mask(m: re.Match[str]) -> str:
        return m["scheme"] + ("***@" if m["userinfo"] else "") + _QUERY_VALUE.sub(r"\1***", m["rest"])
    return _KEY_FLAG.sub(r"\1***", _URL.sub(mask, text))


# A secret's name: --api-key, --hf-token, --password, --client-secret, OPENAI_API_KEY, DB_PASSWD...
_SECRET_NAME = r"[\w.-]*(?:key|token(?!s|iz)|secret|passw(?:or)?d|credentials?|auth)[\w.-]*"
# its value, as a flag's next word (not another flag) or after `=`; a variable's after `=` (`env K=v cmd`)
_SECRET_FLAG = re.compile(rf"(?i)(?<!\S)(--?{_SECRET_NAME})(=|\s+)(?!-)(\S+)")
_SECRET_VARIABLE = re.compile(rf"(?i)(?<!\S)([A-Za-z_]{_SECRET_NAME})=(\S+)")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def redact_command(command: str) -> str:
    """A command line fit to leave the host (events, pages, status; engine/processes.describe): the values of
    secret flags and variables (`--api-key K`, `--token=T`, `HF_TOKEN=T`) and the credentials of URLs masked,
    control characters escaped (it is a user's text). Over-masking is the safe side: `--key-file PATH` loses its
    path too; `--max-tokens N` and `--tokenizer T` keep theirs."""
    command = _SECRET_FLAG.sub(lambda m: f"{m[1]}{m[2]}***", redact(command))
    command = _SECRET_VARIABLE.sub(r"\1=***", command)
    return _CONTROL.sub(lambda m: repr(m[0])[1:-1], command)


class RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class PriorityFormatter(RedactingFormatter):
    """For the journal's stderr stream: a `<N>` syslog priority first, which journald takes as the entry's."""

    def format(self, record: logging.LogRecord) -> str:
        level = record.levelno
        priority = 7 if level < logging.INFO else 6 if level < logging.WARNING else 4 if level < logging.ERROR \
            else 3 if level < logging.CRITICAL else 2
        return f"<{priority}>{super().format(record)}"


def under_systemd() -> bool:
    """True when stderr is the journal stream systemd gave us ($JOURNAL_STREAM is `dev:inode`)."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return stream == f"{st.st_dev}:{st.st_ino}"


def setup(level: str = "info") -> None:
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    handler: logging.Handler
    if under_systemd():
        try:
            from systemd.journal import JournalHandler
        except ImportError:  # systemd-python is optional here: journald reads stderr, with the priority prefixed
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(PriorityFormatter("%(message)s"))
        else:
            handler = JournalHandler(SYSLOG_IDENTIFIER="gpuwarden")
            handler.setFormatter(RedactingFormatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)


def event_fields(kind: str, gpu: str | None, engine: str | None) -> dict[str, str]:
    """Journal fields for an event's log line (ignored by the stderr formatter)."""
    fields = {"GPUWARDEN_EVENT_KIND": kind}
    if gpu:
        fields["GPUWARDEN_GPU"] = gpu
    if engine:
        fields["GPUWARDEN_ENGINE"] = engine
    return fields
