"""A wall-clock step is an event (issue 36: stepped back a day, each new incident bundle deleted the one before).
The host's clock cannot be stepped in a test on a shared machine (it would step every other test's too): the two
clocks WallClock reads are given as a stepped system gives them. Bundle pruning across such a step:
test_report.py."""

from gpuwarden.core.eventkinds import CATALOG
from gpuwarden.core.model import Severity
from gpuwarden.hub.health import WallClock


def test_a_wall_clock_stepped_back_a_day_is_one_event_and_slewing_or_a_suspend_is_none():
    wall, boot = [1_800_000_000.0], [100.0]
    clock = WallClock(lambda: wall[0], lambda: boot[0])
    wall[0], boot[0] = wall[0] + 10, boot[0] + 10.002  # time passing, NTP slewing by milliseconds
    assert clock.step() is None
    wall[0], boot[0] = wall[0] + 3600, boot[0] + 3600  # a suspend: the boot clock runs on through it
    assert clock.step() is None
    wall[0], boot[0] = wall[0] + 10 - 86400, boot[0] + 10  # stepped back a day
    event = clock.step()
    assert event is not None and event.kind == "clock_step" and event.severity == Severity.WARNING
    assert event.evidence == {"step_seconds": -86400.0} and event.time == wall[0]
    assert event.message.startswith("the wall clock stepped back 86400 s (24.0 h): times before and after it")
    assert clock.step() is None  # said once
    wall[0] += 30
    assert clock.step().message.startswith("the wall clock stepped forward 30 s:")
    assert "clock_step" in CATALOG
