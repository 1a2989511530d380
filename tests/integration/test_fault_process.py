"""A GPU fault kills only the engine whose process raised it: the real daemon reads the kernel's records, two real
engine processes share one GPU (a fake Radeon sysfs tree: none is here), and the fault lines name a real process.
Any user in the render group can make a GPU fault; gpuwarden must not be the weapon that kills the engines
sharing that GPU."""

import subprocess
import time

import pytest
from helpers import TEST_GPU, driver_record, wait_for
from test_engines import append, engine_config, events_of, fake_gpus, wait_event


def ring_timeout(d, seq: int, pid: int, name: str) -> None:
    """A ring timeout and its process line, as amdgpu_job.c prints them (two records, the process on the second),
    as the kernel's own records (driver-proven) in the file the daemon follows."""
    fault = f"amdgpu {TEST_GPU}: amdgpu: ring gfx_0.0.0 timeout, signaled seq={seq}, emitted seq={seq + 2}"
    process = f"amdgpu {TEST_GPU}: amdgpu:  Process {name} pid {pid} thread {name}:cs0 pid {pid}"
    append(d, driver_record(fault) + driver_record(process))


@pytest.mark.root
def test_a_fault_kills_only_the_engine_whose_process_raised_it(daemon_factory, fake_engine, tmp_path):
    mine, other = fake_engine("progress"), fake_engine("progress")
    config = (engine_config(mine, "mine", gpus=f'["{TEST_GPU}"]', min_stall='"10m"')
              + engine_config(other, "other", gpus=f'["{TEST_GPU}"]', min_stall='"10m"')
              + fake_gpus(tmp_path, TEST_GPU))
    d = daemon_factory(config).start()
    d.wait_serving()
    for name in ("mine", "other"):  # scraped, so its processes are known
        wait_for(lambda n=name: f'gpuwarden_engine_up{{engine="{n}"}} 1.0' in d.metrics(), 10, what=f"{name} up")
    stranger = subprocess.Popen(["sleep", "60"])  # a local user's own GPU program
    try:
        ring_timeout(d, 1000 + time.time_ns() % 1000, stranger.pid, "sleep")
        fault = wait_event(d, "ring_timeout")
        assert fault["evidence"]["process"] == {"pid": stranger.pid, "name": "sleep"}, fault
        for engine in ("mine", "other"):
            d.wait_log(f"not acting on ring_timeout (would kill {engine}: kernel reported ring_timeout on {TEST_GPU})"
                       f": the fault was raised by pid {stranger.pid} (sleep), not one of {engine}'s processes")
        time.sleep(1)
        assert not events_of(d, "engine_killed")
        assert mine.alive() == mine.pids() and other.alive() == other.pids()

        pid = mine.pids()[0]
        ring_timeout(d, 2000 + time.time_ns() % 1000, pid, "python3")  # now the engine's own job hangs
        killed = wait_event(d, "engine_killed")
        assert killed["engine"] == "mine", killed
        assert f"raised by its process {pid} (python3)" in killed["message"]
        wait_for(lambda: not mine.alive(), 10, what="the engine whose process faulted to die")
        d.wait_log(f"the fault was raised by pid {pid} (python3), not one of other's processes")
        time.sleep(1)
        assert other.alive() == other.pids() and len(events_of(d, "engine_killed")) == 1
        assert [e["evidence"]["process"]["pid"] for e in events_of(d, "ring_timeout")] == [stranger.pid, pid]
    finally:
        stranger.kill()
        stranger.wait()
    assert d.stop() == 0


@pytest.mark.root
def test_a_strangers_xid_kills_no_engine_and_one_naming_no_process_only_makes_a_suspect(daemon_factory, fake_engine,
                                                                                       tmp_path):
    """The H200 case, with `[kernel.xid] "31" = "critical"`: the kernel copy of a stranger's Xid 31 names the
    stranger (refused); an Xid the driver pins on no process (119: the GPU's firmware) makes the engine on that
    GPU a suspect, not a corpse. (NVML's copy, which names no one, is merged with the kernel's: unit tests.)"""
    gpu = "ffff:fe:1f.0"  # NVRM names the bus only ("PCI:ffff:fe:1f"): function 0
    engine = fake_engine("progress")
    config = (engine_config(engine, "mine", gpus=f'["{gpu}"]', canary='"off"') + fake_gpus(tmp_path, gpu)
              + '[kernel.xid]\n"31" = "critical"\n')
    d = daemon_factory(config).start()
    d.wait_serving()
    wait_for(lambda: 'gpuwarden_engine_up{engine="mine"} 1.0' in d.metrics(), 10, what="the engine up")
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        append(d, driver_record(f"NVRM: Xid (PCI:ffff:fe:1f): 31, pid={stranger.pid}, name=sleep, channel "
                                "0x0000000a, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC1 GPCCLIENT_T1_8 faulted "
                                "@ 0x0_00000000.", device=None))
        xid = wait_event(d, "xid")
        assert xid["severity"] == "critical" and xid["evidence"]["process"]["pid"] == stranger.pid, xid
        d.wait_log(f"the fault was raised by pid {stranger.pid} (sleep), not one of mine's processes")
        append(d, driver_record(f"NVRM: Xid (PCI:ffff:fe:1f): 119, pid={stranger.pid}, name=sleep, Timeout after "
                                "6s of waiting for RPC response from GPU0 GSP!", device=None))
        suspect = wait_event(d, "engine_suspect")
        assert suspect["engine"] == "mine" and "(no owner)" in suspect["message"]
        time.sleep(2)
        assert not events_of(d, "engine_killed") and engine.alive() == engine.pids()
    finally:
        stranger.kill()
        stranger.wait()
    assert d.stop() == 0
