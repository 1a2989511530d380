"""Which kernel lines are history (logged before the daemon started) and which are live, at the kernel watch's
edge: judged by each line's own kernel time and boot, not by when it was read."""

from gpuwarden.kernel.records import KernelRecord
from gpuwarden.kernel.sources import this_boot
from watched import watched

LINE = "amdgpu ffff:fe:1f.7: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1, emitted seq=2"


def test_a_line_logged_before_the_start_is_history_and_one_after_is_live():
    before, after = watched([KernelRecord(LINE + " a", timestamp=99.0, boot=this_boot()),
                             KernelRecord(LINE + " b", timestamp=101.0, boot=this_boot())], live_since=100.0)
    assert not before.live and before.evidence["history"] == "logged before gpuwarden started"
    assert after.live


def test_a_line_of_an_earlier_boot_is_history_whatever_its_time():
    """After a reboot the journal's catch-up can hold the last boot's lines; their kernel time counts from
    that boot and may well be later than this boot's start."""
    [old] = watched([KernelRecord(LINE, timestamp=5000.0, boot="00000000-0000-0000-0000-000000000001")],
                    live_since=100.0)
    assert not old.live


def test_without_a_start_time_every_line_is_live():
    [event] = watched([KernelRecord(LINE, timestamp=1.0, boot=this_boot())], live_since=None)
    assert event.live


def test_an_oops_report_of_an_earlier_boot_is_history():
    """A journal's catch-up across a crash reboot holds the earlier boot's oops (its kernel time large, past this
    boot's start): the report's event carried no boot and was judged by its time alone: a live critical page for a
    fault of the boot before."""
    earlier = "00000000-0000-0000-0000-000000000001"
    lines = ["general protection fault, probably for non-canonical address 0xdead",
             "RIP: 0010:amdgpu_vm_update+0x12/0x60 [amdgpu]", " drm_ioctl+0x1/0x2 [drm]",
             "---[ end trace 0000000000000000 ]---"]
    [oops] = watched([KernelRecord(line, timestamp=432_000.0, boot=earlier) for line in lines], live_since=60.0)
    assert oops.kind == "kernel_oops"
    assert not oops.live


def test_a_storm_across_the_start_makes_its_live_implied_event():
    """An Xid 79 storm logged across the start: its first lines are history, and so is the `device_lost` they
    imply. The live lines' `device_lost` was taken for a repeat of the history one (once per GPU within the
    window) and never made: no GPU-lost condition for a GPU lost now."""
    xid = "NVRM: Xid (PCI:ffff:fe:1f.7): 79, pid=1234, name=python3, GPU has fallen off the bus."
    events = watched([KernelRecord(xid, timestamp=t, boot=this_boot()) for t in (99.0, 100.5, 102.0)],
                     live_since=100.0)
    assert sorted((e.kind, e.live) for e in events if e.kind == "device_lost") == [
        ("device_lost", False), ("device_lost", True)]


EARLIER = "00000000-0000-0000-0000-000000000001"
KIQ = "[drm:amdgpu_ring_test_helper [amdgpu]] *ERROR* ring kiq_2.1.0 test failed (-110)"


def test_an_earlier_boots_unfinished_oops_does_not_swallow_this_boots_live_one():
    """A catch-up across a crash reboot often ends the earlier boot's report without its end line: this boot's
    report lines joined it (its stamps, smaller, read as within the window), and the merged report, of the earlier
    boot, was history: this boot's live GPU oops paged nobody."""
    old = [KernelRecord(line, timestamp=5000.0, boot=EARLIER)
           for line in ("general protection fault, probably for non-canonical address 0xdead",
                        "RIP: 0010:amdgpu_vm_update+0x12/0x60 [amdgpu]")]
    new = [KernelRecord(line, timestamp=35.0, boot=this_boot())
           for line in ("BUG: kernel NULL pointer dereference, address: 0000000000000008",
                        "RIP: 0010:amdgpu_job_run+0x12/0x60 [amdgpu]", " drm_ioctl+0x1/0x2 [drm]",
                        "---[ end trace 0000000000000000 ]---")]
    events = [(e.kind, e.live) for e in watched(old + new, live_since=30.0)]
    assert ("kernel_oops", True) in events and ("kernel_oops", False) in events


def test_a_gpu_lost_of_an_earlier_boot_made_by_a_quiet_line_is_history():
    """`device has no AER-aware driver` makes no event of its own (quiet), only the `device_lost` it completes: that
    one carried no boot, judged by its stamp alone: a GPU-lost condition from the boot before."""
    events = watched([KernelRecord("pcieport 0000:00:03.0: AER: device recovery failed", timestamp=5000.0,
                                   boot=EARLIER),
                      KernelRecord("nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)",
                                   timestamp=5000.5, boot=EARLIER)], live_since=100.0)
    assert [e.live for e in events if e.kind == "device_lost"] == [False]


def test_a_correlation_never_pairs_lines_of_two_boots():
    """A reset of the boot before (at 40 s) and this boot's ring test failing at 45 s: a live `reset_failed`
    (runbook: device lost) out of two unrelated lines."""
    events = watched([KernelRecord("amdgpu ffff:fe:1f.7: amdgpu: GPU reset begin!", timestamp=40.0, boot=EARLIER),
                      KernelRecord(f"amdgpu ffff:fe:1f.7: {KIQ}", timestamp=45.0, boot=this_boot())],
                     live_since=30.0)
    assert "reset_failed" not in [e.kind for e in events]


def test_a_boot_reset_is_not_taken_for_the_reset_after_a_fault_of_the_boot_before():
    """amdgpu resets an APU as it starts it (MODE2 reset: info); after a fault it is a warning. An earlier boot's
    ring timeout at 40 s, read beside this boot's start-up reset at 41 s (a catch-up across a reboot), made the
    start-up a reset after a fault. (A line that names no GPU takes the GPU its driver's last line named, of its own
    boot too.)"""
    events = watched([KernelRecord("amdgpu ffff:fe:1f.7: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1, emitted "
                                   "seq=2", timestamp=40.0, boot=EARLIER),
                      KernelRecord("amdgpu ffff:fe:1f.7: amdgpu: MODE2 reset", timestamp=41.0, boot=this_boot())],
                     live_since=30.0)
    assert [(e.severity.name, e.live) for e in events if e.kind == "gpu_reset"] == [("INFO", True)]
