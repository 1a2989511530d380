"""Fault injection with real parts (issue 14): a store locked by another process or on a full disk, a
slowloris /metrics, a 7.7 MB /metrics, SIGTERM while a send hangs and a component fails, an apprise config file.

Deadlines here are generous bounds for "it finished at all", never measures of speed.
"""

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import GPUWARDEN, driver_record, free_port, wait_for

from fakesysfs import build
from faults import LockHolder

RING = "Dec 02 16:22:28 host kernel: amdgpu 0000:{bus}:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1\n"
RING_TEXT = "amdgpu {gpu}: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1"
FAULTING = ("ffff:fe:1f.5", "ffff:fe:1f.6", "ffff:fe:1f.7")  # GPUs no real machine has (fake sysfs below)
HOSTILE = Path(__file__).with_name("hostile_server.py")


def append(d, text: str) -> None:
    with d.log_file.open("a") as log:
        log.write(text)


def alerts(receiver) -> str:
    return (f'[alerts]\ngroup_window = "0s"\nretry_initial = "200ms"\nretry_max = "500ms"\nhostname = "box1"\n'
            f'urls = ["json://127.0.0.1:{receiver.port}/hook"]\n')


def status_lines(notify_socket) -> list[str]:
    notify_socket._pump()
    return [line for m in notify_socket.messages for line in m.split("\n") if line.startswith("STATUS=")]


def longest_block(d) -> float:
    """The longest event-loop block the daemon logged (0 when none)."""
    return max((float(x) for x in re.findall(r"event loop was blocked for ([\d.]+) s", d.log())), default=0.0)


class Hostile:
    """tests/integration/hostile_server.py as a real process."""

    def __init__(self, mode: str, *args: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, str(HOSTILE), str(self.port), mode, *args],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline() == "ready\n"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def hostile():
    made = []

    def make(mode, *args):
        made.append(Hostile(mode, *args))
        return made[-1]

    yield make
    for h in made:
        h.stop()


def faults_while_unwritable(d, receiver, engine, notify_socket, why: str) -> None:
    """Three ring timeouts while the store cannot be written: each is logged, alerted and acted on at once (the
    engine's GPU's names the engine's process: a fault with no owner would only make it a suspect), and STATUS
    and an alert say that the store is unwritable."""
    wait_for(lambda: 'gpuwarden_engine_up{engine="fake"} 1.0' in d.metrics(), 10, what="the engine scraped")
    pid = engine.pids()[0]
    for gpu in FAULTING:
        append(d, driver_record(RING_TEXT.format(gpu=gpu), gpu))  # driver-proven: it may act
        if gpu == FAULTING[0]:
            append(d, driver_record(f"amdgpu {gpu}: amdgpu:  Process python3 pid {pid} thread python3:cs0 pid {pid}",
                                    gpu))
    for gpu in FAULTING:
        wait_for(lambda gpu=gpu: re.search(rf"warning ring_timeout: .* on {gpu}", d.log()), 20,
                 what=f"the ring timeout on {gpu} logged")
    wait_for(lambda: not engine.alive(), 20, what="the engine on the faulting GPU killed")
    titles = lambda: {b["title"] for b in receiver.json_bodies()}  # noqa: E731
    # the faults and the kill (critical: an engine down) of an incident whose picture cannot be written on a full
    # disk: the alert waits for it up to the alerter's 30 s, then goes
    wait_for(lambda: all(any(t.startswith("box1: ") and f"({gpu}, " in t and "ring timeout" in t for t in titles())
                         for gpu in FAULTING), 45, what=f"the three ring-timeout alerts: {titles()}")
    wait_for(lambda: any(t.startswith("box1: events cannot be stored") for t in titles()), 20,
             what="the store-unwritable alert")
    wait_for(lambda: any("STORE UNWRITABLE" in s and why in s for s in status_lines(notify_socket)), 10,
             what="STATUS saying the store is unwritable")
    assert "gpuwarden_store_writable 0.0" in d.metrics()
    assert d.proc.poll() is None


def all_stored_afterwards(d, notify_socket) -> None:
    def stored():
        kinds = [(e["kind"], e["gpu"]) for e in d.events()]
        return all(("ring_timeout", gpu) in kinds for gpu in FAULTING) and \
            any(k == "engine_killed" for k, _ in kinds) and any(k == "store_unwritable" for k, _ in kinds)
    wait_for(stored, 60, interval=0.5, what="every event written once the store works again")
    seen = len(status_lines(notify_socket))
    wait_for(lambda: any("STORE UNWRITABLE" not in s for s in status_lines(notify_socket)[seen:]), 10,
             what="STATUS without the store line")
    assert "gpuwarden_store_writable 1.0" in d.metrics()
    assert longest_block(d) < 4.0  # a write used to hold the loop for the 5 s busy timeout


def engine_on(engine, tmp_path) -> str:
    """The engine on the first faulting GPU, and a Radeon's sysfs (none is here) with the three GPUs, so that
    the daemon has seen them: a fault acts only for a GPU it has seen."""
    root = build(tmp_path / "sys", dict.fromkeys(FAULTING, "rdna3"))
    return (f'[[engine]]\nname = "fake"\nmetrics_url = "{engine.url}"\nscrape_interval = "1s"\n'
            f'gpus = ["{FAULTING[0]}"]\nkill_grace = "1s"\n'
            f'[gpu]\nsysfs_root = "{root}"\nnvml = false\n[guard]\nenabled = false\n')


def test_a_store_locked_by_another_process_loses_no_fault(daemon_factory, receiver, fake_engine, notify_socket,
                                                          tmp_path):
    engine = fake_engine("progress")
    d = daemon_factory(alerts(receiver) + engine_on(engine, tmp_path), env={"NOTIFY_SOCKET": notify_socket.path})
    d.start()
    d.wait_serving()
    holder = LockHolder(d.state / "gpuwarden.db")
    try:
        faults_while_unwritable(d, receiver, engine, notify_socket, "locked by another process")
    finally:
        holder.release()
    all_stored_afterwards(d, notify_socket)
    assert d.stop() == 0


@pytest.mark.root
def test_a_full_disk_loses_no_fault(daemon_factory, receiver, fake_engine, notify_socket, tmp_path):
    engine = fake_engine("progress")
    d = daemon_factory(alerts(receiver) + engine_on(engine, tmp_path), env={"NOTIFY_SOCKET": notify_socket.path})
    d.state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d.state)], check=True)
    try:
        d.start()
        d.wait_serving()
        filler = d.state / "filler"
        with filler.open("wb", buffering=0) as f, pytest.raises(OSError, match="No space left"):
            while True:  # every free byte of the 1 MB tmpfs
                f.write(b"\0" * 4096)
        faults_while_unwritable(d, receiver, engine, notify_socket, "disk is full")
        filler.unlink()
        all_stored_afterwards(d, notify_socket)
        assert d.stop() == 0
    finally:
        if d.proc and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
        subprocess.run(["umount", str(d.state)], check=True)


def test_a_slowloris_metrics_endpoint_fails_at_the_scrape_timeout(daemon_factory, hostile):
    slow = hostile("slowloris")
    d = daemon_factory(f'[[engine]]\nname = "slow"\nmetrics_url = "{slow.url}"\nscrape_interval = "2s"\n'
                       f'scrape_timeout = "2s"\n').start()
    d.wait_serving()
    failures = 'gpuwarden_engine_scrape_failures_total{engine="slow",reason="timeout"} '
    wait_for(lambda: failures in d.metrics(), 30, what="a timed-out scrape")
    wait_for(lambda: re.search(re.escape(failures) + r"[2-9]", d.metrics()), 30, what="a second one")
    assert 'gpuwarden_engine_up{engine="slow"} 0.0' in d.metrics()
    assert d.stop() == 0


def big_body(path: Path, matching: int, padding: int) -> Path:
    """A 7.7 MB /metrics: `matching` series of vLLM's running gauge, `padding` series of another metric."""
    lines = ["# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{model_name="m",replica="r{i:06d}"}} 1' for i in range(matching)]
    lines += [f'other_exporter_bytes{{device="sd{i:06d}",mount="/srv/data/{i:06d}"}} 4096'
              for i in range(padding)]
    lines += ["vllm:num_requests_waiting 0", "vllm:generation_tokens_total 1000"]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(("matching", "padding", "up"), [(110_000, 0, False), (2, 110_000, True)],
                         ids=["110000-series-refused", "large-body-parsed-off-the-loop"])
def test_a_7_7_mb_metrics_body(daemon_factory, hostile, tmp_path, matching, padding, up):
    body = big_body(tmp_path / "metrics.prom", matching, padding)
    assert 6_000_000 < body.stat().st_size < 8 << 20  # under the 8 MiB body cap
    server = hostile("body", str(body))
    d = daemon_factory(f'[[engine]]\nname = "big"\nmetrics_url = "{server.url}"\nprofile = "vllm"\n'
                       f'scrape_interval = "10s"\nscrape_timeout = "10s"\n').start()
    d.wait_serving()
    if up:
        wait_for(lambda: 'gpuwarden_engine_requests_running{engine="big"} 2.0' in d.metrics(), 60,
                 what="the engine's sample from the large body")
    else:
        wait_for(lambda: 'gpuwarden_engine_scrape_failures_total{engine="big",reason="too_large"}' in d.metrics(),
                 60, what="the body refused for its series")
    time.sleep(3)  # the loop's lag is sampled meanwhile
    assert longest_block(d) < 1.0  # parsing 110,000 series on the loop blocked it for seconds per scrape
    assert d.stop() == 0


def test_sigterm_ends_the_daemon_while_a_send_hangs_and_a_component_fails(daemon_factory, hostile):
    silent = hostile("silent")  # takes the alert's POST and never answers
    engine = hostile("silent")  # and an engine whose scrapes all time out
    d = daemon_factory(f'[alerts]\ngroup_window = "0s"\nsend_timeout = "10m"\n'
                       f'urls = ["json://127.0.0.1:{silent.port}/hook?rto=600"]\n'  # read timeout: 10 minutes
                       f'[[engine]]\nname = "hung"\nmetrics_url = "{engine.url}"\nscrape_interval = "1s"\n'
                       f'scrape_timeout = "1s"\n')
    d.start()
    d.wait_serving()
    # the kernel log becomes a directory under the running daemon (check refuses one at the start): its
    # component keeps failing
    d.log_file.unlink()
    d.log_file.mkdir()
    d.wait_log("component kernel failed", timeout=30)
    d.wait_log("alert gw-", timeout=30)  # the failure's alert, whose send hangs
    time.sleep(1)  # the send is under way in its thread
    d.proc.send_signal(signal.SIGTERM)
    rc = d.proc.wait(60)  # the send alone would hold a stop for its 10 minutes
    assert rc == 0, d.log()
    log = d.log()
    assert "stopping" in log and "restarting in" not in log.split("stopping", 1)[1]


APPRISE_YAML = "urls:\n  - json://127.0.0.1:{port}/from-file:\n    - tag: device_lost\n"


def test_an_apprise_config_file_delivers_and_a_broken_one_on_reload_keeps_the_old(daemon_factory, receiver,
                                                                                  notify_socket, tmp_path):
    apprise_file = tmp_path / "apprise.yml"
    apprise_file.write_text(APPRISE_YAML.format(port=receiver.port))
    config = f'[alerts]\ngroup_window = "0s"\nhostname = "box1"\nconfig_file = "{apprise_file}"\n'
    d = daemon_factory(config, env={"NOTIFY_SOCKET": notify_socket.path})
    check = subprocess.run([*GPUWARDEN, "check", "--config", str(d.config_path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    test_alert = subprocess.run([*GPUWARDEN, "test-alert", "--config", str(d.config_path)], capture_output=True,
                                text=True, timeout=60)
    assert test_alert.returncode == 0 and ": ok" in test_alert.stdout, test_alert.stdout + test_alert.stderr
    d.start()
    ready = notify_socket.wait("READY=1", timeout=20)
    d.wait_serving()
    append(d, "Dec 02 16:22:28 host kernel: amdgpu 0000:09:00.0: amdgpu: device lost from bus!\n")
    wait_for(lambda: any("fell off the bus" in b["title"] for b in receiver.json_bodies("/from-file")),
             20, what="the alert through the apprise config file")

    apprise_file.write_text("urls:\n  - notaservice://nothing\n")  # apprise reads it, nothing usable in it
    d.proc.send_signal(signal.SIGHUP)
    reloading = notify_socket.wait("RELOADING=1", after=ready + 1)
    failed = notify_socket.wait("STATUS=reload failed, old configuration kept", after=reloading + 1)
    notify_socket.wait("READY=1", after=failed)
    assert d.proc.poll() is None
    assert d.stop() == 0


def test_with_no_engine_to_watch_status_says_nothing_is_down(daemon_factory, notify_socket):
    d = daemon_factory("[engines]\ndiscover = false\n", env={"NOTIFY_SOCKET": notify_socket.path}).start()
    d.wait_serving()
    d.wait_log("component engines finished")
    seen = len(status_lines(notify_socket))
    wait_for(lambda: len(status_lines(notify_socket)) > seen + 1, 10, what="two more STATUS lines")
    last = status_lines(notify_socket)[-1]
    assert "down" not in last and re.search(r"(\d+)/\1 components up", last), last
    assert d.stop() == 0


def test_a_truncated_database_is_reported_as_truncated(daemon_factory):
    d = daemon_factory().start()
    d.wait_serving()
    for i in range(30):  # a few pages of events
        append(d, RING.format(bus=f"{i + 10:02x}"))
    wait_for(lambda: len(d.events()) >= 30, 30, what="the events stored")
    assert d.stop() == 0
    db = d.state / "gpuwarden.db"
    db.write_bytes(db.read_bytes()[:4096 + 100])  # a copy cut short
    d.start()
    assert d.proc.wait(30) == 1
    assert "database is truncated (4196 bytes; its header says" in d.log()
    assert "locked by another process" not in d.log()


def test_a_retry_waits_its_backoff_after_a_slow_failed_send(daemon_factory):
    """The receiver takes 2 s to answer 500; with retry_initial = 1 s the next attempt comes at least 0.8 s
    (the backoff less its jitter) after the answer, not at once because the send itself took longer."""
    import http.server
    import itertools
    import threading

    arrivals: list[float] = []

    class SlowFailure(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            arrivals.append(time.monotonic())
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            time.sleep(2)
            self.send_response(500)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), SlowFailure)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        d = daemon_factory(f'[alerts]\ngroup_window = "0s"\nretry_initial = "1s"\nretry_max = "1s"\n'
                           f'urls = ["json://127.0.0.1:{server.server_address[1]}/hook"]\n').start()
        d.wait_serving()
        append(d, "Dec 02 16:22:28 host kernel: amdgpu 0000:09:00.0: amdgpu: device lost from bus!\n")
        wait_for(lambda: len(arrivals) >= 3, 30, what="three attempts")
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        assert all(gap >= 2 + 0.8 for gap in gaps[:2]), gaps  # answer after 2 s, then at least 0.8 s of backoff
        # what went wrong, as apprise said it (it read "apprise: 1")
        assert "failed (Failed to send JSON POST notification: Internal server error., error=500.)" in d.log()
        assert d.stop() == 0
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.root
def test_what_a_full_disk_kept_from_the_store_at_the_stop_is_stored_at_the_next_start(daemon_factory, tmp_path):
    """Issue 36: the state disk full when the daemon stops: the events not yet stored were dropped (a GPU lost in
    the outage gone after the reboot). A real full filesystem (tmpfs): the faults of the last seconds are in the
    store after the next start, live (never re-read as history), each once, with the conditions they raised."""
    from gpuwarden.store.sqlite import Store

    d = daemon_factory()
    d.state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(d.state)], check=True)
    try:
        d.start()
        d.wait_serving()
        filler = d.state / "filler"
        with filler.open("wb", buffering=0) as f, pytest.raises(OSError, match="No space left"):
            while True:  # every free byte of the tmpfs
                f.write(b"\0" * 4096)
        lost = "amdgpu {gpu}: amdgpu: device lost from bus!"
        for gpu in FAULTING:
            append(d, driver_record(RING_TEXT.format(gpu=gpu), gpu))
        append(d, driver_record(lost.format(gpu=FAULTING[0]), FAULTING[0]))
        for gpu in FAULTING:
            wait_for(lambda gpu=gpu: re.search(rf"warning ring_timeout: .* on {gpu}", d.log()), 20,
                     what=f"the ring timeout on {gpu} logged")
        wait_for(lambda: "critical device_lost" in d.log(), 20, what="the GPU lost logged")
        wait_for(lambda: "gpuwarden_store_writable 0.0" in d.metrics(), 20, what="the store unwritable")
        assert d.stop() == 0
        spooled = "could not be stored before the stop: kept in" in d.log()
        filler.unlink()  # the disk has room again (at the next boot, say)

        again = daemon_factory(tmp=tmp_path).start()  # the same state folder and kernel log
        again.wait_serving()
        time.sleep(1)  # its start stores the spool before anything reads the store: long done by now
        store = Store(d.state / "gpuwarden.db")
        faults = [e for e in store.events() if e["kind"] in ("ring_timeout", "device_lost")]
        lost_gpus = {c.key.subject for c in store.open_conditions() if c.key.kind == "gpu_lost"}
        store.close()
        assert sorted((e["kind"], e["gpu"]) for e in faults) == sorted(
            [("ring_timeout", gpu) for gpu in FAULTING] + [("device_lost", FAULTING[0])]), faults
        assert not any("history" in e["evidence"] for e in faults)  # as seen live, not read again from the log
        assert again.log().count("critical device_lost") == 1  # the first daemon's: not read again, not said again
        assert lost_gpus == {FAULTING[0]}  # its condition too
        assert spooled and re.search(r"stored \d+ event\(s\) the last stop could not store", again.log())
        assert again.stop() == 0
    finally:
        for daemon in (d, locals().get("again")):
            if daemon and daemon.proc and daemon.proc.poll() is None:
                daemon.proc.kill()
                daemon.proc.wait()
        subprocess.run(["umount", str(d.state)], check=True)
