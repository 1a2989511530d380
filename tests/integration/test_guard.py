"""The recovery guard, inside private mount namespaces (the host's mounts are never changed), and real kernel
uevents through pyudev.

What it guards is brought by the test, so that it runs on any Linux host (a VM's PCI devices may all be on
virtio-pci, whose driver has no `unbind`): a sysfs-shaped tree (tests/fakesysfs.py) whose GPU has a driver with
`bind` and `unbind`, given to the daemon as `[gpu] sysfs_root`, plus the kernel's own
/sys/bus/pci/drivers_probe, which the tree links to as /sys does (every host with a PCI bus has it). The guard's
mechanism is the real one on both: bind mounts remounted read-only, found by mount id. On the kernel's file,
every write names an address no machine has (ffff:fe:1f.7), which the kernel answers with ENODEV when the guard
is absent; the tree's files simply take the write ("written").
"""

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import GPUWARDEN, TEST_GPU, wait_for

from fakesysfs import add_gpu
from gpuwarden.act.guard import DEVICE_FILES

pytestmark = pytest.mark.root

BOGUS = TEST_GPU
PRIVATE = ("unshare", "-m", "--propagation", "private")
DRIVERS_PROBE = Path("/sys/bus/pci/drivers_probe")
WRITE = ("import errno, os, sys\n"
         "try:\n"
         "    fd = os.open(sys.argv[1], os.O_WRONLY)\n"
         "    os.write(fd, sys.argv[2].encode())\n"
         "    print('written')\n"
         "except OSError as e:\n"
         "    print(errno.errorcode[e.errno])\n")


def guarded_tree(root: Path) -> tuple[Path, Path]:
    """A sysfs tree with one GPU at TEST_GPU, bound to a driver, with every file the guard covers, and the
    kernel's drivers_probe linked in: (the tree, its driver's unbind)."""
    if not DRIVERS_PROBE.exists():
        pytest.skip(f"{DRIVERS_PROBE} is missing: this kernel has no PCI bus, so no GPU to guard")
    dev = add_gpu(root, TEST_GPU, "rdna3")
    for name in (*DEVICE_FILES, "resource0_resize"):
        (dev / name).touch()
    os.symlink(DRIVERS_PROBE, root / "bus/pci/drivers_probe")
    return root, (dev / "driver").resolve() / "unbind"


def a_pci_device() -> str:
    """Any PCI device of this machine (a uevent needs a real one; no driver needed)."""
    devices = sorted(Path("/sys/bus/pci/devices").glob("*"))
    if not devices:
        pytest.skip("this machine has no PCI device to ask for a uevent")
    return devices[0].name


def write_bogus(path: Path, *ns_prefix: str) -> str:
    result = subprocess.run([*ns_prefix, sys.executable, "-c", WRITE, str(path), BOGUS], capture_output=True,
                            text=True, timeout=30)
    return result.stdout.strip() or result.stderr


def test_guard_blocks_unbind_with_erofs_and_is_reapplied_when_lost(daemon_factory, tmp_path):
    sysfs, unbind = guarded_tree(tmp_path / "sys")
    d = daemon_factory(f'[gpu]\nsysfs_root = "{sysfs}"\nnvml = false\n'
                       f'[guard]\nenabled = true\ndevices = ["{TEST_GPU}"]\nverify_interval = "500ms"\n')
    d.start(*PRIVATE)
    d.wait_serving()
    inside = ("nsenter", "-t", str(d.proc.pid), "-m")
    wait_for(lambda: write_bogus(unbind, *inside) == "EROFS", 10, what="the guard in the daemon's namespace")
    via_device = sysfs / "bus/pci/devices" / TEST_GPU / "driver" / "unbind"
    assert write_bogus(via_device, *inside) == "EROFS"  # the symlink path crosses the same mount
    assert write_bogus(DRIVERS_PROBE, *inside) == "EROFS"  # the kernel's own file, guarded the same way
    assert write_bogus(DRIVERS_PROBE) == errno.errorcode[errno.ENODEV]  # the host namespace: no guard, the kernel ran
    assert write_bogus(unbind) == "written"
    metrics = d.metrics()
    assert 'gpuwarden_guard_paths{state="intact"} 8' in metrics  # 4 device files, a resize, bind, unbind, probe
    assert 'gpuwarden_guard_paths{state="missing"} 0' in metrics

    subprocess.run([*inside, "umount", str(unbind)], check=True)  # behind the daemon's back
    lost = wait_for(lambda: next((e for e in d.events() if e["kind"] == "guard_lost"), None), 10,
                    what="guard_lost")
    assert lost["evidence"]["paths"] == [str(unbind)]
    wait_for(lambda: write_bogus(unbind, *inside) == "EROFS", 10, what="the guard applied again")
    assert d.stop() == 0
    assert "recovery guard released from 8 file(s)" in d.log()


def test_guard_cli_apply_status_release_in_a_private_namespace(tmp_path):
    sysfs, unbind = guarded_tree(tmp_path / "sys")
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n[gpu]\nsysfs_root = "{sysfs}"\n'
                   f'[guard]\ndevices = ["{TEST_GPU}"]\n')
    gw = " ".join([*GPUWARDEN, "--config", str(cfg)])
    (tmp_path / "write.py").write_text(WRITE)
    probe = "; ".join(f"{sys.executable} {tmp_path / 'write.py'} {path} {BOGUS}" for path in (unbind, DRIVERS_PROBE))
    script = (f"{gw} guard status; {gw} guard apply > /dev/null; {probe}; {gw} guard status --json; "
              f"{gw} guard release > /dev/null; {probe}")
    out = subprocess.run([*PRIVATE, "sh", "-c", script], capture_output=True, text=True, timeout=60).stdout
    lines = out.splitlines()
    assert f"missing  {unbind}" in lines and f"missing  {DRIVERS_PROBE}" in lines
    assert lines[-2:] == ["written", "ENODEV"]  # released: the tree takes the write, the kernel answers
    assert lines[lines.index("EROFS"):][:2] == ["EROFS", "EROFS"]  # applied: both refused
    assert f'{{"path": "{unbind}", "intact": true}}' in out and f'{{"path": "{DRIVERS_PROBE}", "intact": true}}' in out
    assert write_bogus(DRIVERS_PROBE) == "ENODEV"  # the host never saw any of it


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
    device = a_pci_device()
    d = daemon_factory().start()
    d.wait_serving()
    time.sleep(0.5)
    Path("/sys/bus/pci/devices", device, "uevent").write_text("change")  # harmless: asks for a change uevent
    wait_for(lambda: 'gpuwarden_uevents_total{action="change",subsystem="pci"}' in d.metrics(), 10,
             what="the change uevent in the daemon's counters")
    assert d.stop() == 0
