"""The recovery guard on a real PCI device of this machine, inside private mount namespaces (the host's
sysfs is never changed), and real kernel uevents through pyudev.

No device is ever unbound: every write names an address that does not exist (0000:ff:1f.7), which the kernel
answers with ENODEV when the guard is absent.
"""

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import GPUWARDEN, wait_for

pytestmark = pytest.mark.root

BOGUS = "0000:ff:1f.7"
PRIVATE = ("unshare", "-m", "--propagation", "private")
WRITE = ("import errno, os, sys\n"
         "try:\n"
         "    fd = os.open(sys.argv[1], os.O_WRONLY)\n"
         "    os.write(fd, sys.argv[2].encode())\n"
         "    print('written')\n"
         "except OSError as e:\n"
         "    print(errno.errorcode[e.errno])\n")


def a_real_device() -> tuple[str, Path]:
    """A PCI device of this machine that has a driver: (address, its driver's unbind file)."""
    for dev in sorted(Path("/sys/bus/pci/devices").iterdir()):
        driver = dev / "driver"
        if driver.exists() and (driver / "unbind").exists():
            return dev.name, driver.resolve() / "unbind"
    pytest.fail("this machine has no PCI device with a driver to guard")


def write_bogus(path: Path, *ns_prefix: str) -> str:
    result = subprocess.run([*ns_prefix, sys.executable, "-c", WRITE, str(path), BOGUS], capture_output=True,
                            text=True, timeout=30)
    return result.stdout.strip() or result.stderr


def test_guard_blocks_unbind_with_erofs_and_is_reapplied_when_lost(daemon_factory):
    device, unbind = a_real_device()
    d = daemon_factory(f'[guard]\nenabled = true\ndevices = ["{device}"]\nverify_interval = "500ms"\n')
    d.start(*PRIVATE)
    d.wait_serving()
    inside = ("nsenter", "-t", str(d.proc.pid), "-m")
    wait_for(lambda: write_bogus(unbind, *inside) == "EROFS", 10, what="the guard in the daemon's namespace")
    via_device = Path("/sys/bus/pci/devices") / device / "driver" / "unbind"
    assert write_bogus(via_device, *inside) == "EROFS"  # the symlink path crosses the same mount
    assert write_bogus(unbind) == errno.errorcode[errno.ENODEV]  # the host namespace: no guard, the kernel ran
    assert 'gpuwarden_guard_paths{state="intact"}' in d.metrics()

    subprocess.run([*inside, "umount", str(unbind)], check=True)  # behind the daemon's back
    lost = wait_for(lambda: next((e for e in d.events() if e["kind"] == "guard_lost"), None), 10,
                    what="guard_lost")
    assert str(unbind) in lost["evidence"]["paths"]
    wait_for(lambda: write_bogus(unbind, *inside) == "EROFS", 10, what="the guard applied again")
    assert d.stop() == 0
    assert "recovery guard released from" in d.log()


def test_guard_cli_apply_status_release_in_a_private_namespace(tmp_path):
    device, unbind = a_real_device()
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n[guard]\ndevices = ["{device}"]\n')
    gw = " ".join([*GPUWARDEN, "--config", str(cfg)])
    (tmp_path / "write.py").write_text(WRITE)
    probe = f"{sys.executable} {tmp_path / 'write.py'} {unbind} {BOGUS}"
    script = (f"{gw} guard status; {gw} guard apply > /dev/null; {probe}; {gw} guard status --json; "
              f"{gw} guard release > /dev/null; {probe}")
    out = subprocess.run([*PRIVATE, "sh", "-c", script], capture_output=True, text=True, timeout=60).stdout
    lines = out.splitlines()
    assert f"missing  {unbind}" in lines
    assert "EROFS" in lines and lines[-1] == "ENODEV"
    assert f'{{"path": "{unbind}", "intact": true}}' in out
    assert write_bogus(unbind) == "ENODEV"  # the host never saw any of it


def test_guard_refuses_without_root():
    """A forked child that really drops to uid 65534 (no exec: the interpreter is already loaded)."""
    from gpuwarden.act.guard import Guard, GuardError

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.setgid(65534)
        os.setuid(65534)
        try:
            Guard.new(Path("/sys"))
            os.write(write, b"applied")
        except GuardError as exc:
            os.write(write, str(exc).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 1000).decode() == "the recovery guard needs root (it bind-mounts over sysfs files)"


def test_real_kernel_uevents_arrive_through_pyudev(daemon_factory):
    device, _ = a_real_device()
    d = daemon_factory().start()
    d.wait_serving()
    time.sleep(0.5)
    Path("/sys/bus/pci/devices", device, "uevent").write_text("change")  # harmless: asks for a change uevent
    wait_for(lambda: 'gpuwarden_uevents_total{action="change",subsystem="pci"}' in d.metrics(), 10,
             what="the change uevent in the daemon's counters")
    assert d.stop() == 0
