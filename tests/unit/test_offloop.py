import asyncio
import threading

import pytest

from gpuwarden.offloop import Busy, OffLoop


def test_a_hung_call_holds_one_thread_and_the_next_call_for_its_key_is_refused():
    release = threading.Event()
    pool = OffLoop("device", limit=2)

    async def scenario():
        with pytest.raises(TimeoutError):
            await pool.run("gpu0", 0.2, release.wait)  # hangs past its deadline, abandoned
        with pytest.raises(Busy, match="previous device call for gpu0 has not returned"):
            await pool.run("gpu0", 0.2, release.wait)  # single flight: no second thread for gpu0
        other = await pool.run("gpu1", 5, lambda: "gpu1 answers")  # other keys still work
        with pytest.raises(TimeoutError):
            await pool.run("gpu2", 0.2, release.wait)
        with pytest.raises(Busy, match="2 device calls are still running"):  # the pool's bound
            await pool.run("gpu3", 0.2, lambda: None)
        release.set()
        while pool.busy("gpu0") or pool.busy("gpu2"):
            await asyncio.sleep(0.01)
        return other, await pool.run("gpu0", 5, lambda: "gpu0 again")

    assert asyncio.run(scenario()) == ("gpu1 answers", "gpu0 again")


def test_an_exception_in_the_call_reaches_the_caller():
    def fails():
        raise OSError("EREMOTEIO")

    async def scenario():
        await OffLoop("device", 1).run("gpu0", 5, fails)

    with pytest.raises(OSError, match="EREMOTEIO"):
        asyncio.run(scenario())
