"""The kernel log file source on real files: what is not a regular file is refused at once (a directory would read
as an idle log for ever, a FIFO would block the event loop in open()), a regular one is followed."""

import os
import threading

from gpuwarden.kernel.sources import FileSource


def read_bounded(source: FileSource, fifo=None):
    """source._read_new() in a thread: a read that blocks fails the test instead of hanging it."""
    out = {}

    def read():
        try:
            out["value"] = source._read_new()
        except Exception as exc:
            out["error"] = exc

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(5)
    if thread.is_alive() and fifo is not None:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # free the blocked open before failing
    assert not thread.is_alive(), "the read blocked"
    return out


def test_a_directory_as_the_kernel_log_file_is_an_error_not_an_idle_log(tmp_path):
    out = read_bounded(FileSource(tmp_path))
    assert isinstance(out.get("error"), OSError) and "not a regular file" in str(out["error"])


def test_a_fifo_as_the_kernel_log_file_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "kern.log"
    os.mkfifo(fifo)
    out = read_bounded(FileSource(fifo), fifo)
    assert isinstance(out.get("error"), OSError) and "not a regular file" in str(out["error"])


def test_a_regular_file_is_followed_from_its_end(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("Dec 02 16:22:27 host kernel: before the start\n")
    source = FileSource(log)
    assert read_bounded(source)["value"] == ([], False)  # idle: nothing new
    with log.open("a") as f:
        f.write("Dec 02 16:22:28 host kernel: amdgpu ffff:fe:1f.7: amdgpu: device lost from bus!\n")
    records, more = read_bounded(source)["value"]
    assert [r.text for r in records] == ["amdgpu ffff:fe:1f.7: amdgpu: device lost from bus!"] and not more

