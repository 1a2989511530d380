"""What the benches read of a running process, one way for all of them."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

_RSS = re.compile(r"^VmRSS:\s+(\d+)", re.M)


def rss_mb(pid: int | str = "self") -> float:
    """Resident set size in MB (/proc/<pid>/status VmRSS): what the process holds in memory now."""
    match = _RSS.search(Path(f"/proc/{pid}/status").read_text())
    return int(match.group(1)) / 1024 if match else 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def best(fn, n: int = 5) -> float:
    """The fastest of `n` wall-clock runs of `fn()`, in seconds."""
    times = []
    for _ in range(n):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)
