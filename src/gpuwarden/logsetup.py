"""Logging: structured journal entries under systemd, readable lines on stderr otherwise."""

from __future__ import annotations

import logging
import os
import sys


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
        from systemd.journal import JournalHandler

        handler = JournalHandler(SYSLOG_IDENTIFIER="gpuwarden")
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level.upper())


def event_fields(kind: str, gpu: str | None, engine: str | None) -> dict[str, str]:
    """Journal fields for an event's log line (ignored by the stderr formatter)."""
    fields = {"GPUWARDEN_EVENT_KIND": kind}
    if gpu:
        fields["GPUWARDEN_GPU"] = gpu
    if engine:
        fields["GPUWARDEN_ENGINE"] = engine
    return fields
