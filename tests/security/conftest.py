"""The attack suite's parts: a real unprivileged user `gwattacker-<random>` (created here, removed after) who runs
processes and plants files, and the real daemon (tests/integration/helpers.py) as the root it attacks."""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from helpers import FAKE_ENGINE, Daemon, free_port, http_get, listening, wait_for

# A random part: another run of the suite on this machine (its own session, another checkout) has its own
# attacker, and never deletes this one's under it.
ATTACKER = f"gwattacker-{uuid.uuid4().hex[:8]}"
SYSTEM_PYTHON = "/usr/bin/python3"  # the test's own interpreter may live where the attacker cannot read
IMPOSTOR = Path(__file__).with_name("impostor_server.py")


class Attacker:
    """gwattacker: every process it starts here is tracked by pid and ended by pid."""

    def __init__(self, entry: pwd.struct_passwd) -> None:
        self.uid, self.gid, self.name = entry.pw_uid, entry.pw_gid, entry.pw_name
        self.home = Path(entry.pw_dir)
        self.procs: list[subprocess.Popen] = []

    def popen(self, argv: list[str], **kw) -> subprocess.Popen:
        proc = subprocess.Popen(argv, user=self.uid, group=self.gid, extra_groups=[], cwd=self.home,
                                env={"HOME": str(self.home), "PATH": "/usr/bin:/bin", "USER": self.name},
                                start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
        self.procs.append(proc)
        return proc

    def run(self, *argv: str) -> None:
        subprocess.run(list(argv), user=self.uid, group=self.gid, extra_groups=[], cwd=self.home, check=True,
                       env={"HOME": str(self.home), "PATH": "/usr/bin:/bin"}, timeout=30)

    def write(self, path: Path, text: str) -> Path:
        self.run(SYSTEM_PYTHON, "-c", "import sys; open(sys.argv[1], 'w').write(sys.argv[2])", str(path), text)
        return path

    def serve(self, port: int, mode: str, *extra: str, dump: Path | None = None) -> subprocess.Popen:
        """impostor_server.py (its MODE, FILE and extra words) run from the user's home, once it accepts
        connections."""
        for src in [IMPOSTOR] + ([dump] if dump else []):
            shutil.copy(src, self.home / src.name)
            os.chown(self.home / src.name, self.uid, self.gid)
        proc = self.popen([SYSTEM_PYTHON, IMPOSTOR.name, str(port), mode, *([dump.name] if dump else []), *extra])
        return listening(proc, port)

    def engine(self, corpus: Path, mode: str = "progress", *flags: str, port: int | None = None) -> AttackerEngine:
        return AttackerEngine(self, corpus, mode, *flags, port=port)

    def end(self) -> None:
        for proc in self.procs:
            end_tree(proc)


class AttackerEngine:
    """tests/integration/fake_engine.py run by gwattacker from its home: an engine the user controls, whose
    /metrics can report a stall."""

    def __init__(self, user: Attacker, corpus: Path, mode: str, *flags: str, port: int | None = None) -> None:
        self.user, self.port = user, port or free_port()
        for src in (FAKE_ENGINE, corpus / "metrics" / "vllm-01.prom"):
            shutil.copy(src, user.home / src.name)
            os.chown(user.home / src.name, user.uid, user.gid)
        self.pid_file = user.home / f"engine-{self.port}.pids"
        self.proc = user.popen([SYSTEM_PYTHON, "fake_engine.py", "--port", str(self.port), "--dump", "vllm-01.prom",
                                "--mode", mode, "--pids", str(self.pid_file), *flags])
        wait_for(self._answers, 15, what="the attacker's engine")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def _answers(self) -> bool:
        assert self.proc.poll() is None, "the attacker's engine exited"
        try:
            http_get(self.url, timeout=1)
            return True
        except OSError:
            return False

    def pids(self) -> list[int]:
        return [int(x) for x in self.pid_file.read_text().split()]

    def alive(self) -> list[int]:
        return [pid for pid in self.pids() if alive(pid)]

    def set_mode(self, mode: str) -> None:
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{self.port}/mode/{mode}", method="POST"),
                               timeout=2).read()

    def end(self) -> None:
        for pid in self.alive():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def alive(pid: int) -> bool:
    """True while the pid runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="session")
def attacker_account():
    if os.geteuid() != 0:
        pytest.skip("needs root: creates an unprivileged user")
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", "--user-group", ATTACKER], check=True,
                   capture_output=True)
    try:
        yield pwd.getpwnam(ATTACKER)
    finally:
        time.sleep(0.2)  # let processes killed by the tests be reaped
        subprocess.run(["userdel", "--force", "--remove", ATTACKER], check=True, capture_output=True)


@pytest.fixture
def attacker(attacker_account, corpus):
    user = Attacker(attacker_account)
    engines: list[AttackerEngine] = []
    user.start_engine = lambda *a, **kw: engines.append(user.engine(corpus, *a, **kw)) or engines[-1]
    yield user
    for engine in engines:
        engine.end()
    user.end()
    for entry in user.home.iterdir():  # the next test starts from a clean home
        if entry.name.startswith(".") and entry.name in (".bashrc", ".profile", ".bash_logout"):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


_USERS = itertools.count()


@pytest.fixture
def lone_attacker(corpus):
    """A real unprivileged user of this test alone (a unique name: tests on other workers, or other runs on this
    host, never share it), removed with its home and processes after."""
    if os.geteuid() != 0:
        pytest.skip("needs root: creates a user")
    name = f"gwa{os.getpid()}x{next(_USERS)}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", "--user-group", name], check=True,
                   capture_output=True)
    user = Attacker(pwd.getpwnam(name))
    engines: list[AttackerEngine] = []
    user.start_engine = lambda *a, **kw: engines.append(user.engine(corpus, *a, **kw)) or engines[-1]
    try:
        yield user
    finally:
        for engine in engines:
            engine.end()
        user.end()
        time.sleep(0.2)  # let them be reaped
        subprocess.run(["userdel", "--force", "--remove", name], capture_output=True, check=False)


@pytest.fixture
def daemon_factory(tmp_path):
    made: list[Daemon] = []

    def make(config: str = "", **kw) -> Daemon:
        d = Daemon(tmp_path, config, **kw)
        made.append(d)
        return d

    yield make
    for d in made:
        if d.proc and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


@pytest.fixture
def root_process(tmp_path):
    """Root processes the test starts as would-be victims (never real services), ended by pid."""
    made: list[subprocess.Popen] = []

    def start(*argv: str, **kw) -> subprocess.Popen:
        proc = subprocess.Popen(list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, cwd=tmp_path, **kw)
        made.append(proc)
        return proc

    yield start
    for proc in made:
        end_tree(proc)


def end_tree(proc: subprocess.Popen) -> None:
    """Kill a process the test started and every descendant of it (by pid), so no orphan outlives the test."""
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        tree = []
    for member in tree:
        try:
            member.kill()
        except psutil.Error:
            pass
    proc.wait(10)
