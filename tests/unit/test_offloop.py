import asyncio
import threading

import pytest

from gpuwarden.runtime.offloop import Busy, OffLoop


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


def test_a_thread_that_returned_takes_the_next_call_and_ends_when_idle(monkeypatch):
    """Starting a thread makes the loop wait until it runs; a parked thread is handed the call instead. A parked
    thread ends after IDLE seconds without a call, so a pool holds no thread for good."""
    monkeypatch.setattr("gpuwarden.runtime.offloop.IDLE", 0.3)
    pool = OffLoop("look", limit=4)

    marker = threading.local()  # a new thread would not carry it

    def mark():
        marker.seen = True
        return threading.current_thread()

    async def scenario():
        thread = await pool.run("vllm", 5, mark)
        again = await pool.run("llama", 5, lambda: getattr(marker, "seen", False))  # another key, the same thread
        name = await pool.run("vllm", 5, lambda: threading.current_thread().name)
        return thread, again, name

    thread, again, name = asyncio.run(scenario())
    assert again and name == "look:vllm"
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_calls_at_once_each_get_a_thread_within_the_bound():
    gate = threading.Barrier(3, timeout=5)
    pool = OffLoop("look", limit=3)

    async def scenario():
        return await asyncio.gather(*(pool.run(f"e{i}", 5, lambda: (gate.wait(), threading.get_ident())[1])
                                      for i in range(3)))

    assert len(set(asyncio.run(scenario()))) == 3  # three calls met at the barrier: three threads at once
