"""Real parts for integration tests: daemon processes, a notify socket, the kernel log, loopback ports."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

GPUWARDEN = [sys.executable, "-m", "gpuwarden"]
JOURNALD = "/lib/systemd/systemd-journald"


def _port_slice() -> range:
    """This test process's own ports: a slice of those below the kernel's ephemeral range, which no connect() and
    no bind to port 0 ever takes, chosen by the run (its controller's pid) and the xdist worker."""
    with contextlib.suppress(OSError, ValueError):
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        slices = (ephemeral - 10000) // 400
        if slices >= 4:
            worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
            run = os.getppid() if "PYTEST_XDIST_WORKER" in os.environ else os.getpid()
            first = 10000 + ((run * 31 + worker) % slices) * 400
            return range(first, first + 400)
    return range(0)


_PORTS = _port_slice()
_next_port = 0


def free_port() -> int:
    """A loopback port free now, for a server the test starts. A port that the kernel handed out for port 0 and
    that was then closed could be taken as a connection's source port before the server binds it (the bind race),
    so ports come from this process's slice below the ephemeral range, each handed out once in turn; where there
    is no such range, the kernel's choice."""
    global _next_port
    for _ in range(len(_PORTS)):
        port = _PORTS[_next_port % len(_PORTS)]
        _next_port += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # taken by another run or process: the next
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_progress(metrics, engine: str, timeout: float = 30.0) -> None:
    """Wait until a daemon's /metrics (`metrics()`, its text) shows `engine`'s tokens moving: the daemon has seen
    it work, so a stall made next starts from progress the daemon knows (a fixed sleep guessed at its speed)."""
    series = f'gpuwarden_engine_generated_tokens_total{{engine="{engine}"}} '
    seen: list[float] = []

    def moved() -> bool:
        with contextlib.suppress(OSError):
            seen.extend(float(line.removeprefix(series)) for line in metrics().splitlines() if line.startswith(series))
        return len(seen) > 1 and seen[-1] > seen[0]
    wait_for(moved, timeout, interval=0.2, what=f"the daemon to see {engine}'s tokens move")


def listening(proc: subprocess.Popen, port: int) -> subprocess.Popen:
    """`proc`, a server the test started, once it accepts connections on loopback `port`."""
    def accepts() -> bool:
        assert proc.poll() is None, f"the server on port {port} exited"
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return True
        except OSError:
            return False
    wait_for(accepts, 15, what=f"a server on port {port}")
    return proc


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def need(tool: str, package: str = "prometheus") -> str:
    """The path of a test tool; a missing one fails the test (make test-deps installs it), never skips it."""
    if not (path := shutil.which(tool)):
        pytest.fail(f"{tool} is not installed (make test-deps installs Debian's {package} package)")
    return path


HEAVY_LOCK = "/tmp/gpuwarden-heavy.lock"


@contextlib.contextmanager
def heavy_lock():
    """One heavy thing at a time on a shared box (Chromium, an engine): flock on HEAVY_LOCK, unless a process this
    one runs under holds it already (`flock /tmp/gpuwarden-heavy.lock make test`), which waiting would deadlock."""
    with open(HEAVY_LOCK, "a") as lock:
        if not _held_above(os.fstat(lock.fileno())):
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _held_above(st: os.stat_result) -> bool:
    """An ancestor of this process holds the flock on the file `st` is of (/proc/locks: "1: FLOCK ADVISORY WRITE
    <pid> <major>:<minor>:<inode> ...", a waiter's line has "->" in second place)."""
    file = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holders = {int(f[4]) for f in (line.split() for line in Path("/proc/locks").read_text().splitlines())
               if len(f) > 5 and f[1] == "FLOCK" and f[5] == file}
    pid = os.getppid()
    while pid > 1:
        if pid in holders:
            return True
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return False


def http_get(url: str, timeout: float = 2.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


class NotifySocket:
    """A real $NOTIFY_SOCKET: the datagrams a daemon sends, as lists of KEY=VALUE lines."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.messages: list[str] = []

    def _pump(self) -> None:
        try:
            while True:
                self.messages.append(self.sock.recv(65536).decode())
        except TimeoutError:
            pass

    def wait(self, line: str, timeout: float = 10.0, after: int = 0) -> int:
        """Index of the first message after `after` that holds `line`."""
        def found():
            self._pump()
            for i, m in enumerate(self.messages[after:], after):
                if line in m.split("\n") or any(x.startswith(line) for x in m.split("\n")):
                    return i + 1
            return None
        return wait_for(found, timeout, what=f"{line!r} on the notify socket") - 1

    def close(self) -> None:
        self.sock.close()


class Daemon:
    """`gpuwarden run` as a child process with its own config, state dir and exporter port."""

    def __init__(self, tmp: Path, config: str = "", env: dict | None = None, kernel: str | None = None,
                 status_interval: str | None = "1s") -> None:
        """`status_interval`: the daemon's (1 s: a test sees its STATUS soon); None, its default (a bench)."""
        self.tmp = tmp
        self.status_interval = status_interval
        self.port = free_port()
        self.state = tmp / "state"
        self.config_path = tmp / "gpuwarden.toml"
        self.log_file = tmp / "kern.log"
        self.caches = tmp / "cache"
        self.log_file.touch()
        kernel = kernel or f'source = "file"\nfile = "{self.log_file}"'
        self.write_config(config, kernel)
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.stderr_path = tmp / "stderr.log"

    def write_config(self, extra: str = "", kernel: str | None = None) -> None:
        if kernel is not None:
            self._kernel = kernel
        quiet = quiet_discovery(extra)
        self.config_path.write_text(
            f'[daemon]\nstate_dir = "{self.state}"\n'
            + (f'status_interval = "{self.status_interval}"\n' if self.status_interval else "")
            + f'[exporter]\nport = {self.port}\n[cache]\ndirs = ["{self.caches}"]\n'  # never the machine's own caches
            f'[kernel]\n{self._kernel}\n{extra}\n{quiet}')

    def start(self, *prefix: str) -> Daemon:
        """Start it; `prefix` runs it under another command that execs it (e.g. `unshare -m`)."""
        self.stderr = self.stderr_path.open("ab")
        self.started_at = self.stderr.tell()  # this run's log begins here: a restart appends to the last one's
        self.proc = subprocess.Popen([*prefix, *GPUWARDEN, "--config", str(self.config_path), "run"], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=self.stderr)
        return self

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def log_size(self) -> int:
        """Where the log ends now: a step that waits for a line its own action makes starts reading here."""
        return self.stderr_path.stat().st_size

    def wait_log(self, text: str, timeout: float = 10.0, after: int | None = None) -> None:
        """Wait for `text` in what the daemon wrote after offset `after` (default: since its last start), so that
        a line of an earlier run or step never answers for this one."""
        start = self.started_at if after is None else after

        def written() -> bool:
            exited = self.proc.poll() is not None  # before the read: what it wrote before exiting is read
            with self.stderr_path.open("rb") as f:
                f.seek(start)
                if text in f.read().decode(errors="replace"):
                    return True
            assert not exited, f"the daemon exited {self.proc.returncode} without writing {text!r}:\n{self.log()}"
            return False
        wait_for(written, timeout, what=f"{text!r} in the daemon's log")

    def metrics(self) -> str:
        return http_get(f"http://127.0.0.1:{self.port}/metrics")

    def wait_progress(self, engine: str, timeout: float = 30.0) -> None:
        wait_progress(self.metrics, engine, timeout)

    def wait_serving(self) -> str:
        """Metrics answer and every component has started (sources positioned: what is written now is seen)."""
        def scrape():
            try:
                return self.metrics()
            except OSError:
                assert self.proc.poll() is None, f"daemon exited {self.proc.returncode}:\n{self.log()}"
                return None
        metrics = wait_for(scrape, 15, what="the exporter")
        self.wait_log("gpuwarden running")
        return metrics

    def events(self) -> list[dict]:
        out = subprocess.run([*GPUWARDEN, "--config", str(self.config_path), "events", "--jsonl", "--since", "1d"],
                             capture_output=True, text=True, check=True, env=self.env).stdout
        return [json.loads(line) for line in out.splitlines()]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 5.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        self.stderr.close()
        return rc


TEST_GPU = "ffff:fe:1f.7"  # the only GPU address tests write into the host's kernel log: no real machine has it
_PCI_IN_TEXT = re.compile(r"\b([0-9a-fA-F]{4,8}):[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\b")


def write_kmsg(text: str, level: int = 3) -> None:
    """One record in the real kernel log, as a driver's line would appear there. A gpuwarden running on this
    box reads it too, so a line may name only a PCI address in the impossible `ffff` domain."""
    for domain in _PCI_IN_TEXT.findall(text):
        if domain.lower() != "ffff":
            raise ValueError(f"refusing to write a plausible real GPU address into the kernel log: {text!r}")
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(f"<{level}>{text}\n")


_SEQ = iter(range(1, 1 << 62))


def driver_record(text: str, device: str | None = TEST_GPU, level: int = 3) -> str:
    """A driver's line as the kernel's own /dev/kmsg record carries it: facility 0 (the kernel's) and, for a line
    printed by dev_printk, SUBSYSTEM=/DEVICE= metadata. Append it to the file a daemon follows (`kernel.source =
    "file"`, the Daemon's `log_file`): user space can write neither the kernel's facility nor device metadata to
    the real /dev/kmsg, so this is how a test hands the daemon a line that may act (kernel/classifier.unverified).
    Only `ffff` addresses, as for write_kmsg."""
    for domain in _PCI_IN_TEXT.findall(text) + ([device.split(":")[0]] if device else []):
        if domain.lower() != "ffff":
            raise ValueError(f"refusing a plausible real GPU address in a test's kernel line: {text!r}")
    meta = f" SUBSYSTEM=pci\n DEVICE=+pci:{device}\n" if device else ""
    return f"{level},{next(_SEQ)},{time.monotonic_ns() // 1000},-;{text}\n{meta}"


def quiet_discovery(extra: str) -> str:
    """Discovery sees every engine-like server on the host, other tests' too (they run side by side): a test's
    daemon discovers only where its test asks for it ([engines]); one with an [[engine]] never does."""
    return "" if "[engines]" in extra or "[[engine]]" in extra else "[engines]\ndiscover = false\n"


class Receiver:
    """A real HTTP server on loopback that records what apprise posts; it can go down and come back on the
    same port to play an outage."""

    def __init__(self) -> None:
        self.port = free_port()
        self.received: list[dict] = []
        self.delay = 0.0  # seconds it waits, the message received, before it answers
        self._server = None

    def start(self) -> Receiver:
        import http.server
        import threading

        received, receiver = self.received, self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))  # ntfy posts attachments raw
                received.append({"path": self.path, "headers": dict(self.headers), "raw": raw,
                                 "body": raw.decode(errors="replace")})
                time.sleep(receiver.delay)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"id": "ok"}')

            def log_message(self, *args):
                pass

        http.server.ThreadingHTTPServer.allow_reuse_address = True
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def json_bodies(self, path: str | None = None) -> list[dict]:
        return [json.loads(r["body"]) for r in self.received if path is None or r["path"].startswith(path)]


FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")


class FakeEngine:
    """tests/integration/fake_engine.py as a real process tree in its own session, as systemd starts one."""

    def __init__(self, tmp: Path, dump: Path, profile: str = "vllm", mode: str = "progress", *flags: str,
                 port: int | None = None) -> None:
        self.port = port or free_port()
        self.pid_file = tmp / f"engine-{self.port}.pids"
        self.proc = subprocess.Popen(
            [sys.executable, str(FAKE_ENGINE), "--port", str(self.port), "--dump", str(dump), "--profile", profile,
             "--mode", mode, "--pids", str(self.pid_file), *flags], start_new_session=True)
        wait_for(self._answers, 15, what="the fake engine's /metrics")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def _answers(self) -> bool:
        try:
            http_get(self.url, timeout=1)
            return True
        except OSError:
            return False

    def pids(self) -> list[int]:
        return [int(x) for x in self.pid_file.read_text().split()]

    def alive(self) -> list[int]:
        return [pid for pid in self.pids() if _alive(pid)]

    def set_mode(self, mode: str) -> None:
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{self.port}/mode/{mode}", method="POST"),
                               timeout=2).read()

    def kill(self) -> None:
        for pid in self.alive():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)


def _alive(pid: int) -> bool:
    """True while the pid runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
