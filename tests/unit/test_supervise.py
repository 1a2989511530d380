import asyncio

from gpuwarden.runtime.supervise import Supervisor


class Flaky:
    def __init__(self, log, fail_times):
        self.name, self.log, self.fail_times = "flaky", log, fail_times

    async def run(self):
        self.log.append("start")
        if self.log.count("start") <= self.fail_times:
            raise RuntimeError("boom")
        await asyncio.sleep(3600)


class Steady:
    name = "steady"

    def __init__(self, ticks):
        self.ticks = ticks

    async def run(self):
        while True:
            self.ticks.append(1)
            await asyncio.sleep(0.01)


def test_a_failing_component_restarts_with_backoff_while_others_run():
    crashes, states, log, ticks = [], [], [], []

    async def scenario():
        sup = Supervisor(lambda n, e: crashes.append((n, str(e))), lambda n, up, r: states.append((n, up, r)),
                         backoff=0.01, max_backoff=0.04, unhealthy_after=5)
        sup.start("flaky", lambda: Flaky(log, fail_times=3))
        sup.start("steady", lambda: Steady(ticks))
        await asyncio.sleep(0.3)
        healthy, summary = sup.healthy(), sup.summary()
        await sup.stop()
        return healthy, summary

    healthy, summary = asyncio.run(scenario())
    assert crashes == [("flaky", "boom")] * 3
    assert log.count("start") == 4
    assert ("flaky", True, 3) in states  # up again after three restarts
    assert len(ticks) > 10  # the other component never stopped
    assert healthy and summary == "2/2 components up"


def test_crash_loop_makes_the_supervisor_unhealthy():
    async def scenario():
        sup = Supervisor(lambda n, e: None, lambda n, up, r: None, backoff=0.001, max_backoff=0.001)
        sup.start("flaky", lambda: Flaky([], fail_times=100))
        await asyncio.sleep(0.1)
        healthy = sup.healthy()
        await sup.stop()
        return healthy

    assert asyncio.run(scenario()) is False


class GroupFailure:
    name = "group"

    async def run(self):
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._fail())

    async def _fail(self):
        raise ValueError("the real reason")


def test_a_failure_inside_a_task_group_is_reported_by_its_real_cause():
    crashes = []

    async def scenario():
        sup = Supervisor(lambda n, e: crashes.append(repr(e)), lambda *a: None, backoff=10)
        sup.start("group", GroupFailure)
        await asyncio.sleep(0.05)
        await sup.stop()

    asyncio.run(scenario())
    assert crashes == ["ValueError('the real reason')"]


class FailsWhenCancelled:
    """Turns its cancellation into an error, as a component whose cleanup fails does (a store already closed)."""

    name = "fails_when_cancelled"

    def __init__(self, starts):
        self.starts = starts

    async def run(self):
        self.starts.append(1)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise RuntimeError("store is closed") from None


def test_a_stopping_supervisor_restarts_nothing_and_reports_no_crash():
    crashes, starts = [], []

    async def scenario():
        sup = Supervisor(lambda n, e: crashes.append(n), lambda *a: None, backoff=0.0)
        sup.start("c", lambda: FailsWhenCancelled(starts))
        await asyncio.sleep(0.05)
        stuck = await sup.stop(timeout=5)
        await asyncio.sleep(0.1)  # a restart would have happened by now
        return stuck

    assert asyncio.run(scenario()) == []
    assert starts == [1] and crashes == []


class SwallowsCancellation:
    name = "swallows"

    def __init__(self, stubborn):
        self.stubborn = stubborn

    async def run(self):
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if not self.stubborn:
                    raise


def test_stop_returns_at_its_deadline_and_names_a_component_that_will_not_end():
    stubborn = [True]

    async def scenario():
        sup = Supervisor(lambda n, e: None, lambda *a: None)
        sup.start("swallows", lambda: SwallowsCancellation(stubborn))
        sup.start("steady", lambda: Steady([]))
        await asyncio.sleep(0.05)
        task = next(t for t in asyncio.all_tasks() if t.get_name() == "swallows")
        stuck = await sup.stop(timeout=0.5)
        stubborn.clear()  # let the test end: it takes its next cancellation
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return stuck

    assert asyncio.run(scenario()) == ["swallows"]


class NothingToDo:
    name = "idle"

    async def run(self):
        return


def test_a_component_with_nothing_to_do_is_not_down():
    async def scenario():
        sup = Supervisor(lambda n, e: None, lambda *a: None)
        sup.start("engines", NothingToDo)
        sup.start("steady", lambda: Steady([]))
        await asyncio.sleep(0.05)
        summary = sup.summary()
        await sup.stop()
        return summary

    assert asyncio.run(scenario()) == "2/2 components up"
