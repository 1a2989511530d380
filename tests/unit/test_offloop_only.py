"""Issue 24: a FIFO's open() in the shared default pool stranded its threads until nothing else ran (no kill, no
reload). Every blocking call goes through a named, bounded OffLoop pool of its own kind of work; nothing in
src/ may use the default executor (asyncio.to_thread, loop.run_in_executor)."""

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "gpuwarden"
DEFAULT_POOL = re.compile(r"\bto_thread\b|\brun_in_executor\b")


def test_no_blocking_call_goes_to_the_default_pool():
    found = [f"{path.relative_to(SRC)}:{number}: {line.strip()}"
             for path in sorted(SRC.rglob("*.py")) if path.name != "runtime/offloop.py"
             for number, line in enumerate(path.read_text().splitlines(), 1) if DEFAULT_POOL.search(line)]
    assert not found, "use a named gpuwarden.runtime.offloop.OffLoop pool:\n" + "\n".join(found)


def test_each_pool_has_its_own_name():
    names = re.findall(r'OffLoop\("([^"]+)"', "\n".join(p.read_text() for p in SRC.rglob("*.py")))
    assert len(names) == len(set(names)) >= 10, names
