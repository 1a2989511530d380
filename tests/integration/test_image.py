"""The image of the repository's Dockerfile, built and run by the real Docker engine (tests/peers/docker.py).

No registry is reachable here, so the base is not `python:3.11-slim` but the Debian 12 root that
tests/nspawn/install.sh made (Python 3.11 and its venv module), imported with `docker import`, and the build runs
with no network at all: the Dockerfile's PIP_OPTIONS point pip at a folder of wheels in the build context, which
`pip wheel` filled here from the package index pip is configured with. The context is the repository's files
(`git ls-files`: what a clone holds, and what is not yet committed but not ignored) and that folder. The
container then runs the daemon as the DaemonSet does, on a kernel log file mounted in: /metrics answers on the
published port, and a fault line written to the file on the host is stored.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from helpers import free_port, http_get, wait_for

from gpuwarden import __version__
from peers.docker import SOCKET, docker

pytestmark = pytest.mark.root  # dockerd

ROOT = Path(__file__).resolve().parents[2]
NSPAWN = Path(os.environ.get("GPUWARDEN_NSPAWN") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
              / "gpuwarden-nspawn") / "bookworm"
TAG = f"gpuwarden:{__version__}"  # what `docker build -t` in the Dockerfile's header makes
XID = "Dec 02 16:22:28 host kernel: NVRM: Xid (PCI:ffff:fe:1f): 79, pid=1, GPU has fallen off the bus.\n"
TOKEN = "tk_never_in_an_image_4f1c9a"  # in a user's my.toml beside the checkout's files


def _client(*args: str, stdin: bytes | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "--host", f"unix://{SOCKET}", *args], input=stdin, capture_output=True,
                          timeout=timeout)


def logs(name: str) -> str:
    done = _client("logs", name, timeout=60)
    return (done.stdout + done.stderr).decode(errors="replace")[-5000:]


def base_image() -> str:
    """The nspawn root as an image, imported once per build of that root (its .installed stamp is the tag)."""
    if not (NSPAWN / ".installed").is_file():
        pytest.fail(f"no Debian root in {NSPAWN}: `make nspawn` (or make test) builds it")
    tag = "gwtest-bookworm:" + hashlib.sha256((NSPAWN / ".installed").read_bytes()).hexdigest()[:16]
    if not docker("images", "-q", tag):
        tar = subprocess.run(["tar", "-C", str(NSPAWN), "--one-file-system", "--numeric-owner", "-c", "."],
                             capture_output=True, timeout=600, check=True).stdout
        done = _client("import", "-", tag, stdin=tar)
        assert done.returncode == 0, done.stderr.decode()
    return tag


def context(into: Path) -> Path:
    """The build context: the repository's files, and wheels/ for pip."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, timeout=60, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():  # a file deleted but not yet committed is still listed
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, into / name, follow_symlinks=False)
    (into / "wheels").mkdir()
    (into / "my.toml").write_text(f'[alerts]\nurls = ["ntfys://{TOKEN}@ntfy.sh/box"]\n')
    return into


@pytest.fixture(scope="module")
def image(docker_engine, tmp_path_factory) -> str:
    wheels = context(tmp_path_factory.mktemp("context")) / "wheels"
    # gpuwarden's dependencies with the image's extras (systemd-python built here, where its headers are); the
    # build backend: what the Dockerfile's header says to put in wheels/
    for what in ([f"{ROOT}[journal,web]"], ["--no-deps", "setuptools>=77"]):
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(wheels), *what],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    built = _client("build", "--network", "none", "-t", TAG, "--build-arg", f"BASE={base_image()}",
                    "--build-arg", "PIP_OPTIONS=--no-index --find-links /src/wheels", str(wheels.parent))
    assert built.returncode == 0, (built.stdout + built.stderr).decode()[-5000:]
    return TAG


def _layers(image: str, into: Path) -> list[tarfile.TarFile]:
    """The image's layers as `docker save` writes them, bottom first (the base's first)."""
    saved = into / "image.tar"
    done = _client("save", "-o", str(saved), image, timeout=600)
    assert done.returncode == 0, done.stderr.decode()
    with tarfile.open(saved) as tar:
        tar.extractall(into / "saved", filter="data")
    manifest = json.loads((into / "saved/manifest.json").read_text())[0]
    return [tarfile.open(into / "saved" / layer) for layer in manifest["Layers"]]


def test_no_layer_of_the_image_holds_a_file_of_the_checkout(image, tmp_path):
    """Every layer the Dockerfile adds above the base holds /opt/gpuwarden and nothing else; no layer of the
    image holds the user's token (the old Dockerfile's `COPY . /src` then `rm` left the whole checkout,
    my.toml with it, in a layer)."""
    base = json.loads(docker("inspect", "--format", "{{json .RootFS.Layers}}", base_image()))
    ours = json.loads(docker("inspect", "--format", "{{json .RootFS.Layers}}", image))
    assert ours[:len(base)] == base and len(ours) > len(base)
    layers = _layers(image, tmp_path)
    assert len(layers) == len(ours)
    for tar in layers[len(base):]:
        names = [n.strip("./") for n in tar.getnames()]
        stray = [n for n in names if n and n != "opt" and not n.startswith("opt/gpuwarden")]
        assert not stray, stray[:20]
    for tar in layers:
        for member in tar.getmembers():
            if member.isfile():
                assert TOKEN.encode() not in tar.extractfile(member).read(), member.name
    history = docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", image)
    assert "/src" not in history, history  # the build stage's `COPY . /src` is none of the image's steps


def test_the_image_has_the_extras_its_manifests_use(image):
    """The DaemonSet's source = "auto" reads the journal (systemd-python); its web config needs bcrypt and PyYAML."""
    done = _client("run", "--rm", "--network", "none", "--entrypoint", "/opt/gpuwarden/bin/python", image, "-c",
                   "import systemd.journal, bcrypt, yaml; print('ok')", timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == b"ok", done.stderr.decode()


def test_a_kernel_log_the_host_does_not_have_is_said_not_run_on(image, tmp_path):
    """docs/service.md's `-v /var/log/kern.log:…` on a host without that file: Docker makes a directory of it.
    The daemon ran on it, its kernel source failing in a loop while `check` called the file valid and the status
    said all components up; now the container stops at once with the reason."""
    config = tmp_path / "gpuwarden.toml"
    config.write_text('[exporter]\nlisten = "0.0.0.0"\n[kernel]\nsource = "file"\nfile = "/var/log/kern.log"\n')
    missing = tmp_path / "no-such-kern.log"
    name = f"gwtest-image-missing-{os.getpid()}"
    try:
        done = _client("run", "--name", name, "--network", "none", "-v", f"{missing}:/var/log/kern.log:ro",
                       "-v", f"{config}:/etc/gpuwarden/gpuwarden.toml:ro", image, timeout=120)
        assert missing.is_dir()  # what Docker did with the path the host does not have
        assert done.returncode == 78, (done.stdout + done.stderr).decode()
        assert b"kernel.file: '/var/log/kern.log' is a directory, not a log file" in done.stderr, done.stderr
    finally:
        docker("rm", "-f", name, check=False)


def test_the_image_runs_the_daemon_on_a_mounted_kernel_log(image, tmp_path):
    log, config, port = tmp_path / "kern.log", tmp_path / "gpuwarden.toml", free_port()
    log.touch()
    config.write_text('[exporter]\nlisten = "0.0.0.0"\n[kernel]\nsource = "file"\nfile = "/var/log/kern.log"\n')
    name = f"gwtest-image-{os.getpid()}"
    docker("run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:10440", "-v", f"{log}:/var/log/kern.log:ro",
           "-v", f"{config}:/etc/gpuwarden/gpuwarden.toml:ro", image)
    try:
        def serving():
            state = json.loads(docker("inspect", name))[0]["State"]
            assert state["Running"], logs(name)
            try:
                return http_get(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                return None
        metrics = wait_for(serving, 60, interval=0.5, what="the container's /metrics on the published port")
        assert "gpuwarden_build_info{" in metrics
        wait_for(lambda: 'gpuwarden_source_up{source="kernel"} 1.0' in http_get(f"http://127.0.0.1:{port}/metrics"),
                 30, interval=0.5, what="the kernel source up in the container")
        with log.open("a") as out:
            out.write(XID)

        def stored():
            events = json.loads(docker("exec", name, "gpuwarden", "events", "--json"))
            return [e for e in events if e["kind"] == "xid"]
        event = wait_for(stored, 30, interval=1, what="the Xid stored in the container")[0]
        assert (event["gpu"], event["evidence"]["xid"]) == ("ffff:fe:1f.0", 79)
        docker("stop", "-t", "15", name, timeout=60)
        state = json.loads(docker("inspect", name))[0]["State"]
        assert state["ExitCode"] == 0, logs(name)
    finally:
        docker("rm", "-f", name, check=False)

