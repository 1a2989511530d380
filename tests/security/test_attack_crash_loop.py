"""Issue 24, finding 2: an engine that may only be alerted on, discovered or configured so, exits three times in
ten minutes (anyone can restart a look-alike server) and root renamed the compile caches of root and of every
login user. Now the engine's own settings govern the quarantine too, and it moves only that engine's user's
caches. Every cache here is one the test made."""

import time

import pytest
from helpers import wait_for

pytestmark = pytest.mark.root


def events_of(d, kind):
    return [e for e in d.events() if e["kind"] == kind]


def poisoned(folder):
    (folder / "fx").mkdir(parents=True)
    (folder / "fx" / "kernel.so").touch()  # zero bytes: what a power cut leaves
    (folder / "fx" / "real.py").write_text("# compiled\n")
    return folder


def attackers_cache(attacker):
    cache = attacker.home / ".triton" / "cache"
    attacker.run("mkdir", "-p", str(cache / "fx"))
    attacker.run("touch", str(cache / "fx" / "kernel.so"))
    return cache


def crash_loop(d, attacker, engine, exits=3, up=1.0):
    """The attacker's engine dies and comes back on its port, `exits` times, each time after `up` seconds (a
    scrape must see it back before its next exit counts)."""
    for n in range(1, exits + 1):
        time.sleep(up)
        engine.end()
        wait_for(lambda n=n: len(events_of(d, "engine_exited")) >= n, 30, interval=0.5, what=f"exit {n}")
        engine = attacker.start_engine("progress", "vllm", "serve", "Qwen/Qwen3-0.6B", port=engine.port)
    wait_for(lambda: events_of(d, "engine_crash_loop"), 30, interval=0.5, what="the crash loop")
    return engine


def engine_config(engine, **settings) -> str:
    opts = {"scrape_interval": '"0.5s"', "unresponsive_after": "100", "crash_loop_exits": "3", **settings}
    return (f'[[engine]]\nname = "theirs"\nmetrics_url = "{engine.url}"\n'
            + "".join(f"{k} = {v}\n" for k, v in opts.items()))


def configure(d, extra: str, *more_caches) -> None:
    """The daemon's config with `extra`, and [cache] dirs of its own cache and `more_caches`."""
    d.write_config(extra)
    caches = ", ".join(f'"{p}"' for p in (d.caches, *more_caches))
    d.config_path.write_text(d.config_path.read_text().replace(f'dirs = ["{d.caches}"]', f"dirs = [{caches}]"))


def test_an_alert_only_engine_in_a_crash_loop_renames_nothing(attacker, daemon_factory):
    engine = attacker.start_engine("progress", "vllm", "serve", "Qwen/Qwen3-0.6B")
    theirs = attackers_cache(attacker)
    d = daemon_factory()
    poisoned(d.caches)
    configure(d, engine_config(engine, on_stall='"alert"', on_gpu_fault='"alert"', on_unresponsive='"alert"'), theirs)
    d.start()
    d.wait_serving()
    crash_loop(d, attacker, engine)
    time.sleep(2)  # a quarantine would have run by now
    assert not events_of(d, "cache_poisoned")
    assert (d.caches / "fx" / "kernel.so").exists() and (theirs / "fx" / "kernel.so").exists()
    assert not list(d.caches.parent.glob("cache.BROKEN-*")) and not list(theirs.parent.glob("cache.BROKEN-*"))
    assert d.stop() == 0


def test_a_discovered_lookalike_crash_looping_renames_nothing(attacker, daemon_factory):
    engine = attacker.start_engine("progress", "vllm", "serve", "Qwen/Qwen3-0.6B")
    d = daemon_factory('[engines]\ndiscover_interval = "1s"\n')
    poisoned(d.caches)  # root's cache, in [cache] dirs
    d.start()
    d.wait_log(f"discovered vllm serving on port {engine.port}", timeout=20)
    wait_for(lambda: f'gpuwarden_engine_up{{engine="vllm-{engine.port}"}} 1.0' in d.metrics(), 20,
             what="the look-alike watched")
    crash_loop(d, attacker, engine, up=6.0)  # a discovered engine is scraped every 5 s
    time.sleep(2)
    assert not events_of(d, "cache_poisoned")
    assert (d.caches / "fx" / "kernel.so").exists() and not list(d.caches.parent.glob("cache.BROKEN-*"))
    [loop] = [e for e in events_of(d, "engine_crash_loop") if e["engine"] == f"vllm-{engine.port}"]
    assert loop["severity"] == "warning" and loop["evidence"]["lookalike"], loop  # a look-alike: never a page
    assert d.stop() == 0


def test_a_crash_loop_moves_only_its_own_users_caches(attacker, daemon_factory):
    engine = attacker.start_engine("progress", "vllm", "serve", "Qwen/Qwen3-0.6B")
    theirs = attackers_cache(attacker)
    d = daemon_factory()
    poisoned(d.caches)  # root's: not the engine's user's
    configure(d, engine_config(engine), theirs)
    d.start()
    d.wait_serving()
    crash_loop(d, attacker, engine)
    moved = wait_for(lambda: next(iter(events_of(d, "cache_poisoned")), None), 30, interval=0.5,
                     what="the engine user's cache moved")
    assert [m["dir"] for m in moved["evidence"]["moved"]] == [str(theirs)]
    assert list(theirs.parent.glob("cache.BROKEN-*-crash_loop")) and not theirs.exists()
    assert (d.caches / "fx" / "kernel.so").exists() and not list(d.caches.parent.glob("cache.BROKEN-*"))
    assert d.stop() == 0
