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
