"""A real Docker engine for the tests, and llama-server in a container with its port published.

Debian's docker.io (dockerd 20.10; `make test-deps` installs it). When no daemon answers on
/var/run/docker.sock, one is started here and stopped at the end, its data root cached outside the repository
(~/.cache/gpuwarden-docker: the image stays between runs). What works on the CI host (cgroup v1 hybrid, no
systemd): the cgroupfs driver (dockerd's default without systemd), overlay2 (vfs when overlay2 cannot mount),
and `--iptables=false`: the host's firewall is left alone, and a port published on 127.0.0.1 still works
through docker-proxy (the userland proxy, the default), which forwards it over the docker0 bridge.

No registry is reachable, so the image is made with `docker import` from a tar of exactly what the host's
llama-server build needs (the binary, the libraries `ldd` names, the GGUF model), at the same absolute paths:
the container runs the very command line a host process can run too.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path

import psutil

from peers import slowload
from peers.engines import LLAMA_SERVER, LlamaCpp, core, gguf_model, is_gone, missing

SOCKET = Path("/var/run/docker.sock")
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuwarden-docker"
EXEC_ROOT = Path("/run/gpuwarden-test-docker")
PORT = 8080  # llama-server's port inside the container


def docker(*args: str, timeout: float = 60, check: bool = True) -> str:
    """The docker client (of whatever version: it speaks the daemon's API version)."""
    out = subprocess.run(["docker", "--host", f"unix://{SOCKET}", *args], capture_output=True, text=True,
                         timeout=timeout)
    if check and out.returncode:
        raise RuntimeError(f"docker {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout.strip()


class Dockerd:
    """The Docker engine the tests use: one already answering, or one started here (or by an interrupted run
    of these tests: then it is stopped at the end too)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.adopted: psutil.Process | None = None
        self.log = CACHE / "dockerd.log"
        self.driver = ""

    @staticmethod
    def answers() -> bool:
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            return subprocess.run(["docker", "--host", f"unix://{SOCKET}", "version"], capture_output=True,
                                  timeout=10).returncode == 0
        return False

    def start(self) -> Dockerd:
        if not shutil.which("dockerd"):
            raise RuntimeError("dockerd is missing: `make test-deps` installs Debian's docker.io")
        if self.answers():
            self.adopted = _left_over()
            _remove_left_over_containers()
            return self
        for driver in ("overlay2", "vfs"):
            data_root = CACHE / f"data-root-{driver}"
            data_root.mkdir(parents=True, exist_ok=True)
            with self.log.open("ab") as log:
                self.proc = subprocess.Popen(
                    ["dockerd", "--data-root", str(data_root), "--exec-root", str(EXEC_ROOT),
                     "--pidfile", f"{EXEC_ROOT}.pid", "--host", f"unix://{SOCKET}", "--storage-driver", driver,
                     "--iptables=false", "--ip6tables=false"],
                    stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + 60
            while self.proc.poll() is None and time.monotonic() < deadline and not self.answers():
                time.sleep(0.3)
            if self.proc.poll() is None and self.answers():
                self.driver = driver
                _remove_left_over_containers()  # stopped ones, kept in the cached data root
                return self
            self.stop()
        raise RuntimeError(f"dockerd did not start with overlay2 or vfs:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        """SIGTERM (dockerd stops its containerd), then SIGKILL to its whole session."""
        if self.adopted is not None:
            with contextlib.suppress(psutil.Error):
                self.adopted.terminate()
                self.adopted.wait(30)
            self.adopted = None
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None


def _left_over() -> psutil.Process | None:
    """The dockerd an interrupted run of these tests started (by its pidfile and its data root), if it runs."""
    with contextlib.suppress(OSError, ValueError, psutil.Error):
        proc = psutil.Process(int(Path(f"{EXEC_ROOT}.pid").read_text()))
        if proc.name() == "dockerd" and any(str(CACHE) in arg for arg in proc.cmdline()):
            return proc
    return None


def _remove_left_over_containers() -> None:
    """Containers of earlier test sessions that ended without removing them (the session's pid is gone)."""
    for name in docker("ps", "-a", "--format", "{{.Names}}").split():
        if (m := re.fullmatch(r"gwtest-llama-(\d+)-\d+", name)) and not psutil.pid_exists(int(m.group(1))):
            docker("rm", "-f", name, check=False)


def llama_image() -> str:
    """The llama-server image, imported once per build and model (the tag is their hash); it holds the slow-load
    shim too (tests/peers/slowload.py), used only by a container started with LD_PRELOAD naming it."""
    model = gguf_model("tiny")
    files = _needed(LLAMA_SERVER) | {model, slowload.shim()}
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(str(path).encode() + path.read_bytes())
    tag = f"gwtest-llamacpp:{digest.hexdigest()[:16]}"
    if not docker("images", "-q", tag):
        tar = io.BytesIO()
        with tarfile.open(fileobj=tar, mode="w") as out:
            for path in sorted(files):
                out.add(path.resolve(), arcname=str(path).lstrip("/"))
        subprocess.run(["docker", "--host", f"unix://{SOCKET}", "import", "-", tag], input=tar.getvalue(),
                       capture_output=True, timeout=120, check=True)
    return tag


def _needed(binary: Path) -> set[Path]:
    """The binary and every library `ldd` says it loads (with the dynamic loader)."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=30, check=True).stdout
    return {binary, *(Path(p) for p in re.findall(r"(/\S+) \(0x", out))}


class LlamaContainer:
    """llama-server in a container (`--init`: docker-init is its PID 1), 127.0.0.1:<port> published."""

    def __init__(self, port: int, run_dir: Path, metrics: bool = True, tty: bool = False, slots: int = 4,
                 flags: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        self.port, self.tty, self.env = port, tty, env or {}
        self.name = f"gwtest-llama-{os.getpid()}-{port}"
        server = LlamaCpp(PORT, run_dir, metrics=metrics, slots=slots)
        self.argv = [*(a.replace("127.0.0.1", "0.0.0.0") for a in server.command()), *flags]  # through docker0
        self.twin: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    def start(self) -> LlamaContainer:
        if why := missing("llamacpp"):
            raise RuntimeError(why)
        docker("run", "-d", "--init", "--name", self.name, "-p", f"127.0.0.1:{self.port}:{PORT}",
               "--cpuset-cpus", str(core("llamacpp")), *(["-t"] if self.tty else []),
               *(a for k, v in self.env.items() for a in ("-e", f"{k}={v}")), llama_image(), *self.argv)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.inspect()["State"]["Status"] != "running":
                raise RuntimeError(f"the container exited during start-up:\n{self.logs()[-3000:]}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                if response.status == 200:
                    return self
            time.sleep(0.5)
        raise RuntimeError(f"llama-server in {self.name} did not answer /health:\n{self.logs()[-3000:]}")

    def inspect(self) -> dict:
        return json.loads(docker("inspect", self.name))[0]

    def running(self) -> bool:
        return self.inspect()["State"]["Running"]

    def logs(self) -> str:
        out = subprocess.run(["docker", "--host", f"unix://{SOCKET}", "logs", self.name], capture_output=True,
                             text=True, timeout=30)
        return out.stdout + out.stderr

    def pids(self) -> list[int]:
        """Host pids of the container's processes: its init and what descends from it."""
        init = psutil.Process(self.inspect()["State"]["Pid"])
        return sorted([init.pid, *(p.pid for p in init.children(recursive=True))])

    def engine_pid(self) -> int:
        """llama-server's host pid (its inference thread has TID == PID)."""
        return next(pid for pid in self.pids() if os.readlink(f"/proc/{pid}/exe") == str(LLAMA_SERVER))

    def start_twin(self) -> subprocess.Popen:
        """The same command line as a host process, in a network namespace of its own (its 0.0.0.0:8080 is
        that namespace's, not the host's): it must survive every kill of the container."""
        self.twin = subprocess.Popen(["unshare", "--net", *self.argv], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and psutil.Process(self.twin.pid).cmdline() != self.argv:
            time.sleep(0.05)  # unshare has exec'd llama-server
        return self.twin

    def gone(self, pids: list[int]) -> bool:
        return all(is_gone(pid) for pid in pids)

    def stop(self) -> None:
        docker("rm", "-f", self.name, timeout=60, check=False)
        if self.twin is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.twin.pid, signal.SIGKILL)
            self.twin.wait(10)
