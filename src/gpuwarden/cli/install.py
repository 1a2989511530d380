"""`gpuwarden install`: puts the files a package manager would (the systemd unit, the example configuration, the
man page, the bash completion, `gpuwarden` on PATH) where systemd, man, bash and the shell look for them, for the
gpuwarden this one is. Under a root (`--root`, a packager's DESTDIR) everything lands below it while the paths
written into the unit and the link stay those of the running system."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

# The unit as shipped names the Makefile's default PREFIX; the unit placed names where gpuwarden really is.
SHIPPED_EXECUTABLE = "/opt/gpuwarden/bin/gpuwarden"
UNIT = "etc/systemd/system/gpuwarden.service"
CONFIG = "etc/gpuwarden/gpuwarden.toml"
COMMAND = "bin/gpuwarden"  # below the prefix: the command on PATH, a link


def shipped(name: str) -> str:
    """A file the wheel ships in gpuwarden/share (the unit, the example configuration)."""
    return resources.files("gpuwarden").joinpath("share", name).read_text()


def executable() -> str:
    """The `gpuwarden` script of this installation: next to this interpreter (a virtualenv's bin), else on PATH."""
    beside = Path(sys.executable).parent / "gpuwarden"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside.absolute())
    found = shutil.which("gpuwarden")
    if not found:
        raise LookupError("no gpuwarden script next to this Python nor on PATH: give --exec PATH")
    return str(Path(found).absolute())


def unit(exe: str) -> str:
    if not os.path.isabs(exe):
        raise ValueError(f"--exec {exe!r}: systemd needs an absolute path")
    if any(c.isspace() for c in exe):
        raise ValueError(f"--exec {exe!r}: a path with blanks would be split by systemd's command line")
    return shipped("gpuwarden.service").replace(SHIPPED_EXECUTABLE, exe)


@dataclass(frozen=True)
class Placed:
    path: Path
    mode: int
    kept: bool = False  # an existing file left as it was (the configuration; another installation's command)
    target: str | None = None  # a link: what it names


def _write(path: Path, text: str, mode: int) -> Placed:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    tmp = path.with_name(f".{path.name}.new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(tmp, mode)  # the umask may have taken bits away
    os.replace(tmp, path)
    return Placed(path, mode)


def _config(path: Path) -> Placed:
    """It holds the alert URLs' tokens: root's alone (0600). An existing one is the admin's: kept, and only
    tightened (group and others lose their access; a stricter mode such as 0400 stays)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = path.stat().st_mode & 0o700
        os.chmod(path, mode)
        return Placed(path, mode, kept=True)
    with os.fdopen(fd, "w") as out:
        out.write(shipped("gpuwarden.toml"))
    os.chmod(path, 0o600)
    return Placed(path, 0o600)


def _command(path: Path, exe: str) -> Placed:
    """`gpuwarden` on PATH: a link to the installation's script (the man page and the completion name a command
    the shell must find). What is there and is no link is another installation's (pip's own script): kept."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    if os.path.lexists(path) and not path.is_symlink():
        return Placed(path, path.lstat().st_mode & 0o777, kept=True)
    if not os.path.isabs(exe):
        raise ValueError(f"--exec {exe!r}: the link on PATH needs an absolute path")
    tmp = path.with_name(f".{path.name}.new")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(exe, tmp)
    os.replace(tmp, path)
    return Placed(path, 0o777, target=exe)


def install(root: Path, prefix: str, exe: str, man_page: str, completion: str) -> list[Placed]:
    """The unit (0644), the configuration (0600, an existing one kept), the man page and the completion (0644),
    the command on PATH (a link to `exe`) under `root`; the last three below `prefix` (/usr for a distribution,
    /usr/local by hand). Where `exe` is that very path (pip installed it there), nothing is linked."""
    share = root / prefix.lstrip("/") / "share"
    placed = [_write(root / UNIT, unit(exe), 0o644),
              _config(root / CONFIG),
              _write(share / "man/man1/gpuwarden.1", man_page, 0o644),
              _write(share / "bash-completion/completions/gpuwarden", completion, 0o644)]
    if os.path.normpath(exe) != os.path.normpath(f"/{prefix.strip('/')}/{COMMAND}"):
        placed.append(_command(root / prefix.lstrip("/") / COMMAND, exe))
    return placed


def placed_paths(root: Path, prefix: str) -> list[Path]:
    """What `install` places that `uninstall` takes away: everything but the configuration (the admin's, with
    its tokens) and the state dir (the event store), which are kept; and the command on PATH, where it is a
    link (a script there is another installation's)."""
    base = root / prefix.lstrip("/")
    command = base / COMMAND
    return [root / UNIT, base / "share/man/man1/gpuwarden.1", base / "share/bash-completion/completions/gpuwarden",
            *([command] if command.is_symlink() else [])]


def uninstall(root: Path, prefix: str) -> list[Path]:
    """The files `install` placed, removed; those that were not there are not listed."""
    removed = []
    for path in placed_paths(root, prefix):
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed
