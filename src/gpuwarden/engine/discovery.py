"""Find engine servers running on this host: a known server command line, and the port it listens on; and
which source each can be watched through (its /metrics, llama.cpp's /slots, or its unit's journal), with
what a user can switch on to get more."""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

from gpuwarden.engine.logprofiles import LOG_BY_NAME
from gpuwarden.engine.profiles import PROFILES

COMMANDS = {**{p.name: p.commands for p in PROFILES}, "ollama": ("ollama serve",)}
# what to switch on for per-step progress, by engine
MORE = {
    "vllm": "/metrics is on by default; its log needs log stats on (no --disable-log-stats)",
    "sglang": "start it with --enable-metrics (or watch its log: source = \"log\")",
    "llamacpp": "start it with --metrics (without it: /slots, on unless --no-slots, or its log)",
    "tgi": "/metrics is on by default",
    "ollama": "Ollama has no /metrics: run it as a systemd unit (its journal) with a canary_interval",
}
_PROBE_TIMEOUT = 2.0


@dataclass(frozen=True, slots=True)
class Found:
    profile: str
    pid: int
    port: int
    command: str
    source: str = "metrics"  # metrics | slots | log | none
    log_unit: str | None = None

    @property
    def name(self) -> str:
        return f"{self.profile}-{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    @property
    def more(self) -> str:
        return MORE[self.profile]


def discover() -> list[Found]:
    """One entry per engine server: the outermost process whose command line names a known server and that
    listens on a TCP port (its lowest, which is the HTTP API for all five engines)."""
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
        profile = next((name for name, commands in COMMANDS.items() if any(c in command for c in commands)), None)
        if profile:
            found.append(Found(profile, pid, min(ports), command))
    return sorted(found, key=lambda f: f.port)


def with_source(found: Found) -> Found:
    """The best source this engine offers now: /metrics when it answers, else llama.cpp's /slots, else the
    journal of the systemd unit it runs in (for an engine with a log profile), else none."""
    base = f"http://127.0.0.1:{found.port}"
    if found.profile != "ollama" and _answers(f"{base}/metrics"):
        return found
    if found.profile == "llamacpp" and _answers(f"{base}/slots"):
        return Found(**{**_fields(found), "source": "slots"})
    unit = unit_of(found.pid)
    if unit and found.profile in LOG_BY_NAME:
        return Found(**{**_fields(found), "source": "log", "log_unit": unit})
    return Found(**{**_fields(found), "source": "none"})


def unit_of(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The systemd service a process runs in, from its cgroup path (…/name.service[/…])."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        for part in reversed(line.split(":", 2)[-1].split("/")):
            if part.endswith(".service"):
                return part
    return None


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=_PROBE_TIMEOUT) as response:
            response.read(1 << 20)
            return response.status == 200
    except (OSError, ValueError):
        return False


def _fields(found: Found) -> dict:
    return {"profile": found.profile, "pid": found.pid, "port": found.port, "command": found.command}


def hint(metrics_url: str) -> str | None:
    """For `probe` when /metrics does not answer: a source the engine at that address does offer."""
    parts = metrics_url.split("/", 3)
    base = "/".join(parts[:3])
    if _answers(f"{base}/slots"):
        return 'llama.cpp without --metrics: its /slots answers; watch it with source = "slots" (or start it ' \
               'with --metrics)'
    if _answers(f"{base}/api/ps"):
        return f'Ollama (no /metrics): {MORE["ollama"]}: source = "log", log_unit = "ollama.service"'
    return None
