"""The unit file's settings, and structured logging into a real journal."""

import os
import subprocess
import time
from pathlib import Path

import pytest
from helpers import GPUWARDEN, wait_for, write_kmsg

ROOT = Path(__file__).resolve().parents[2]


# systemd-analyze verify runs on the unit as `gpuwarden install` places it: tests/integration/test_install_config.py


def test_unit_creates_no_mount_namespace():
    """Options that give the service its own mount namespace would hide the guard's bind mounts."""
    unit = (ROOT / "systemd/gpuwarden.service").read_text()
    settings = {line.split("=", 1)[0] for line in unit.splitlines() if "=" in line and not line.startswith("#")}
    forbidden = {"ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "ProtectKernelTunables",
                 "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups", "ReadOnlyPaths",
                 "InaccessiblePaths", "TemporaryFileSystem", "BindPaths", "ProtectProc", "PrivateMounts"}
    assert not settings & forbidden
    assert {"Type", "WatchdogSec", "Restart", "CapabilityBoundingSet"} <= settings


@pytest.mark.root
def test_under_systemd_events_are_logged_with_journal_fields(daemon_factory, journald):
    """The daemon's stderr is a real journal stream (systemd-cat), announced through $JOURNAL_STREAM as
    systemd does for services."""
    d = daemon_factory(kernel='source = "kmsg"')
    tag = f"gwjournal{os.getpid()}x{time.time_ns()}"
    command = " ".join([*GPUWARDEN, "--config", str(d.config_path), "run"])
    proc = subprocess.Popen(["systemd-cat", "-t", tag, "sh", "-c",
                             f'JOURNAL_STREAM=$(stat -L -c %d:%i /proc/self/fd/2) exec {command}'])
    try:
        wait_for(lambda: "kernel source" in _journal("SYSLOG_IDENTIFIER=gpuwarden", "-o", "cat"), 15,
                 what="the daemon's startup in the journal")
        write_kmsg(f"amdgpu ffff:fe:1f.7: amdgpu: ring sdma0 timeout, signaled seq=1, emitted seq=2 {tag}")
        wait_for(lambda: "ffff:fe:1f.7" in _journal("GPUWARDEN_EVENT_KIND=ring_timeout", "GPUWARDEN_GPU=ffff:fe:1f.7",
                                                    "-o", "cat"), 15, what="the structured event entry")
    finally:
        proc.terminate()
        proc.wait(10)


def _journal(*args: str) -> str:
    return subprocess.run(["journalctl", "--no-pager", *args], capture_output=True, text=True).stdout
