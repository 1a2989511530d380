"""Find engine servers running on this host: a known server command line, and the port it listens on."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from gpuwarden.engine.profiles import PROFILES


@dataclass(frozen=True, slots=True)
class Found:
    profile: str
    pid: int
    port: int
    command: str

    @property
    def name(self) -> str:
        return f"{self.profile}-{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"


def discover() -> list[Found]:
    """One entry per engine server: the outermost process whose command line names a known server and that
    listens on a TCP port (its lowest, which is the HTTP API for all four engines)."""
    listening: dict[int, set[int]] = {}
    for conn in psutil.net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN and conn.pid and conn.laddr:
            listening.setdefault(conn.pid, set()).add(conn.laddr.port)
    found = []
    for pid, ports in listening.items():
        try:
            command = " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            continue
        profile = next((p for p in PROFILES if any(c in command for c in p.commands)), None)
        if profile:
            found.append(Found(profile.name, pid, min(ports), command))
    return sorted(found, key=lambda f: f.port)
