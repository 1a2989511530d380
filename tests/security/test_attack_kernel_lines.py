"""Issue 23: a local user makes the kernel itself print a line that looks like a GPU driver's. The kernel prints
text a user chose at the start of some of its own lines: the name a process gave itself (prctl(PR_SET_NAME), 15
bytes) when it segfaults (`debug.exception-trace = 1`, the default) or takes a general protection fault, and a
mount option it passed to tmpfs inside its own user namespace. Here the real unprivileged user gwattacker does
each for real, the real kernel prints it into the real /dev/kmsg (facility 0: the kernel's own), and gpuwarden
reads it through its real source: nothing at warning or above, and an engine on those GPUs is not killed.
Only `ffff` PCI addresses are written (no real machine has that domain)."""

import asyncio
import time

import pytest
from helpers import TEST_GPU, FakeEngine, wait_for, write_kmsg
from test_engines import engine_config, events_of, fake_gpus

from gpuwarden.kernel.classifier import Classifier
from gpuwarden.kernel.sources import KmsgSource

pytestmark = pytest.mark.root

SYSTEM_PYTHON = "/usr/bin/python3"  # the attacker cannot read the test's own interpreter

SEGFAULT = "import ctypes; ctypes.CDLL(None).prctl(15, {name!r}, 0, 0, 0); ctypes.string_at(0)"
GP_FAULT = "import ctypes; ctypes.CDLL(None).prctl(15, {name!r}, 0, 0, 0); ctypes.CFUNCTYPE(None)(1 << 63)()"
MOUNT_OPTIONS = ("NVRM: Xid (PCI:ffff:fe:1f): 79", f"amdgpu {TEST_GPU}: amdgpu: device lost from bus!")


def forge(attacker) -> list[str]:
    """Make the kernel print the forged lines; what each printed line holds."""
    for code, name in ((SEGFAULT, b"ring x timeout"), (GP_FAULT, b"sq_intr: error")):
        assert attacker.popen([SYSTEM_PYTHON, "-c", code.format(name=name)]).wait(30) < 0  # it died of its fault
    (attacker.home / "x").mkdir(exist_ok=True)
    for option in MOUNT_OPTIONS:  # refused by tmpfs, which prints the option back
        attacker.popen(["unshare", "-rm", "mount", "-t", "tmpfs", "-o", option, "none", str(attacker.home / "x")]
                       ).wait(30)
    return ["ring x timeout[", "traps: sq_intr: error[", *(f"tmpfs: Unknown parameter '{o}'" for o in MOUNT_OPTIONS)]


async def read_until(source: KmsgSource, wanted: list[str], timeout: float = 15.0) -> list:
    seen = []

    async def read():
        async for batch in source.batches():
            seen.extend(batch)
            if all(any(w in r.text for r in seen) for w in wanted):
                return
    await asyncio.wait_for(read(), timeout)
    return seen


def test_lines_the_kernel_prints_with_a_users_text_read_as_nothing(attacker):
    source = KmsgSource(tick=0.1)
    source.start()
    try:
        wanted = forge(attacker)
        records = asyncio.run(read_until(source, wanted))
    finally:
        source.close()
    forged = [r for r in records if any(w in r.text for w in wanted)]
    assert len(forged) == len(wanted), [r.text for r in forged]
    assert all(r.facility == 0 for r in forged)  # the kernel printed them: the facility alone proves nothing
    assert "ring x timeout" in forged[0].text and "segfault at" in forged[0].text
    classifier = Classifier()
    bursts = [b for r in forged for b in classifier.feed(r, time.time())]
    bursts += classifier.flush(time.time(), everything=True).new
    assert [(b.event.kind, b.event.severity, b.event.message) for b in bursts] == []


def test_forged_kernel_lines_kill_no_engine(attacker, daemon_factory, tmp_path, corpus):
    """The daemon reads the real /dev/kmsg; an engine runs on both GPUs the forged lines name, which the daemon
    has seen (a Radeon's sysfs tree, faked: none is here), so a line taken for a fault would kill it."""
    engine = FakeEngine(tmp_path, corpus / "metrics" / "vllm-01.prom")
    gpus = (TEST_GPU, "ffff:fe:1f.0")  # the tmpfs Xid names ffff:fe:1f (function 0)
    try:
        config = (engine_config(engine, gpus=f'["{gpus[0]}", "{gpus[1]}"]', min_stall='"10m"')
                  + fake_gpus(tmp_path, *gpus))
        d = daemon_factory(config, kernel='source = "kmsg"').start()
        d.wait_serving()
        wait_for(lambda: 'gpuwarden_engine_up{engine="fake"} 1.0' in d.metrics(), 10, what="the engine scraped")
        wanted = forge(attacker)
        # Written after the forged lines, by root through /dev/kmsg: stored once they were all read, as evidence
        # that no record proves (user space's facility), never acted on.
        sentinel = f"amdgpu {TEST_GPU}: amdgpu: sq_intr: error, detail 0x00000000, sentinel {time.time_ns()}"
        write_kmsg(sentinel)
        mark = wait_for(lambda: next((e for e in d.events() if e["evidence"].get("line") == sentinel), None), 20,
                        what="the sentinel's event")
        assert mark["evidence"]["verified"] is False and mark["severity"] == "warning", mark
        events = d.events()
        assert not [e for e in events if any(w in str(e["evidence"]) for w in wanted)], events
        assert not events_of(d, "engine_killed") and engine.alive() == engine.pids()
        assert d.stop() == 0
    finally:
        engine.kill()
