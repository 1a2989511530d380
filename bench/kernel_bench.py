"""Kernel-watch benchmark: classifier throughput and /dev/kmsg-to-store latency, each beside the naive
alternative measured in the same run.

    make bench          # or: .venv/bin/python bench/kernel_bench.py [--lines N] [--writes N]

Throughput: lines per second of `Classifier.feed_all` on one core for (a) benign lines only and (b) a realistic mix
(99 % benign, 1 % GPU faults arriving in storms), in `--rounds` interleaved rounds of (classifier on the benign
lines, `grep -E -c` with a hand-written fault pattern on the same lines, classifier on the mix): each is reported as
its median with the spread (min-max) of the rounds, so that a figure is neither one lucky run nor one unlucky one
on a shared machine; and of `parse_lines` + `feed_all` from raw `dmesg` text. A flood: the CPU a fault line costs when
it only joins its storm's open burst (storms of each fault kind), as cores for 50,000 such lines a second. With
`--against REV`, the classifier of an earlier commit (its `src/` taken with `git archive`) on the same lines, in
the same run.
Latency (root, needs journald): a fault line is written to /dev/kmsg and the clock stops when its event row is
visible in the daemon's SQLite store (looked for as soon as the store writes in its folder: inotify), for `source =
"auto"` under a running journald (kmsg live, journal catch-up), `kmsg` and `journal`, beside `journalctl -kf | grep
--line-buffered -E ...` printing it, all in the same run. The alternative of issue 40's goal, `dmesg -W | grep
--line-buffered -E` with the same expressions, follows the very writes of the `auto` and `kmsg` runs: each write is
timed to its row and to the pipeline's line in one loop, so that both meet the same moment of the machine. The
writes take turns among kinds (LATENCY_LINES): a ring timeout is held for the process line that may follow it and
released on its own deadline, the others are stored at once; each kind is reported.
Lines written from user space are stored as unverified evidence (never acted on): the path and its timing are
those of a driver's line.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import random
import select
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from figure import figure, load
from gpuwarden.kernel.classifier import Classifier
from gpuwarden.kernel.formats import parse_lines
from gpuwarden.kernel.records import KernelRecord

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "corpus" / "kernel"
NAIVE_PATTERN = (r"sq_intr|ring .* timeout|GPU reset|Recovery Failed|device lost|page fault|Xid|fallen off the bus|"
                 r"AER|BUG:|Oops")

JOURNALD = "/lib/systemd/systemd-journald"
LATENCY_LINES = {  # kind -> a line of it (ffff: no real machine has that PCI domain)
    "ring_timeout (held)": "amdgpu ffff:fe:1f.7: amdgpu: ring gfx_0.0.0 timeout, signaled seq={i}",
    "sq_intr": "amdgpu ffff:fe:1f.7: amdgpu: sq_intr: error, detail 0x00000000, type 1, sh 1, wave_id {i}",
    "xid": "NVRM: Xid (PCI:ffff:fe:1f): 13, pid={i}, name=python3, Graphics SM Warp Exception",
}
BATCH = 1000  # records per feed_all: what the sources read at once in a busy log is of this order
LINE_GAP = 0.001  # seconds between lines: a busy kernel log; storms 5000 lines apart are separate events

NOISE = [
    "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
    "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
    'audit: type=1400 audit(1700000000.123:45): apparmor="DENIED" operation="open" profile="snap.x" name="/proc/1"',
    "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
    "docker0: port 1(veth1234) entered forwarding state",
    "nvme nvme0: 32/0/0 default/read/poll queues",
    "TCP: request_sock_TCP: Possible SYN flooding on port 8000. Sending cookies.  Check SNMP counters.",
    "[UFW BLOCK] IN=eth0 OUT= MAC=00:11:22:33:44:55 SRC=10.0.0.5 DST=10.0.0.1 LEN=60 PROTO=TCP SPT=5 DPT=22",
    "perf: interrupt took too long (2502 > 2500), lowering kernel.perf_event_max_sample_rate to 79750",
    "systemd-journald[412]: Data hash table of /var/log/journal/x/system.journal has a fill level at 75.0",
    "br-1a2b3c: port 2(veth9f8e7d) entered blocking state",
    "amdgpu ffff:fe:1f.7: amdgpu: ring gfx_0.0.0 uses VM inv eng 0 on hub 0",
    "[drm] PCIE GART of 512M enabled (table at 0x000000801FB00000).",
    "kfd kfd: amdgpu: added device 1002:7550",
]
FAULTS = [
    "amdgpu ffff:fe:1f.7: amdgpu: sq_intr: error, detail 0x00000000, type 1, sh 1, priv 1, wave_id {i}, simd_id 0",
    "NVRM: Xid (PCI:0000:41:00): 13, pid=2924364, name=pt_main_thread, Graphics SM Warp Exception on (GPC {i})",
    "amdgpu 0000:83:00.0: amdgpu: [gfxhub0] no-retry page fault (src_id:0 ring:144 vmid:3 pasid:{i})",
]


def benign_lines(n: int, rng: random.Random) -> list[str]:
    pool = NOISE + [r.text for p in sorted(CORPUS.glob("*benign*nvidia*")) for r in
                    parse_lines(p.read_text().splitlines()).records]
    return [rng.choice(pool) for _ in range(n)]


def mix_lines(n: int, rng: random.Random) -> list[str]:
    """99 % benign; faults arrive in storms of 50 lines, as sq_intr and Xid 13 do."""
    lines = benign_lines(n, rng)
    for start in range(0, n - 50, 5000):
        fault = rng.choice(FAULTS)
        lines[start:start + 50] = [fault.format(i=i) for i in range(50)]
    return lines


def records_of(lines: list[str]) -> list[KernelRecord]:
    return [KernelRecord(text, i * LINE_GAP) for i, text in enumerate(lines)]


def classify_rate(records: list[KernelRecord]) -> tuple[float, int]:
    """(lines/s, events) of a fresh classifier on `records`, in CPU time. The garbage of whatever ran before is
    collected first: no run pays for another's."""
    gc.collect()
    classifier = Classifier()
    events = 0
    start = time.process_time()
    if hasattr(classifier, "feed_all"):  # in batches, as the kernel watch feeds what its source read
        for i in range(0, len(records), BATCH):
            events += sum(len(started) for _, started in classifier.feed_all(records[i:i + BATCH], 0.0))
    else:  # the classifier of an older commit (--against)
        for record in records:
            events += len(classifier.feed(record, 0.0))
    return len(records) / (time.process_time() - start), events


class Rounds(NamedTuple):
    benign: list[float]  # lines/s, one per round
    grep: list[float]
    mix: list[float]
    benign_events: int
    mix_events: int


def interleaved(benign: list[str], mix: list[str], rounds: int, grep: bool = True) -> Rounds:
    """`rounds` rounds of (classifier on `benign`, `grep -E -c` on the same lines, classifier on `mix`), taken in
    turns: a slow spell of the shared machine falls on all of them, not on one."""
    benign_records, mix_records = records_of(benign), records_of(mix)
    out = Rounds([], [], [], 0, 0)
    with tempfile.NamedTemporaryFile("w", suffix=".log") as f:
        f.write("\n".join(f"[{i * LINE_GAP:12.6f}] {line}" for i, line in enumerate(benign)) + "\n")
        f.flush()
        for _ in range(rounds):
            rate, events = classify_rate(benign_records)
            out.benign.append(rate)
            if grep:
                out.grep.append(len(benign) / _timed(["grep", "-E", "-c", NAIVE_PATTERN, f.name]))
            rate, mix_events = classify_rate(mix_records)
            out.mix.append(rate)
    return out._replace(benign_events=events, mix_events=mix_events)


def spread(rates: list[float]) -> str:
    """The median, then the min-max of the rounds."""
    return f"{statistics.median(rates):,.0f} ({min(rates):,.0f}–{max(rates):,.0f})"


def storm_cost(lines_per_kind: int = 20_000, unique: bool = False) -> float:
    """CPU seconds a fault line costs when it only joins the open burst of its storm (the storms of FAULTS, one
    after the other, each line the next of 50 waves, GPCs or pasids, as a storm repeats a few texts): what a flood
    of fault lines costs (issue 40's goal, 50,000 lines/s on at most 0.15 of a core, is 3 µs a line). `unique`: every
    line's text a new one (a number no line repeats), the classifier's worst case."""
    gc.collect()
    lines = [fault.format(i=i if unique else i % 50) for fault in FAULTS for i in range(lines_per_kind)]
    records = records_of(lines)
    classifier = Classifier()
    start = time.process_time()
    for i in range(0, len(records), BATCH):
        classifier.feed_all(records[i:i + BATCH], 0.0)
    return (time.process_time() - start) / len(records)


def parse_and_classify_rate(lines: list[str]) -> float:
    text = [f"[{i * LINE_GAP:12.6f}] {line}" for i, line in enumerate(lines)]
    classifier = Classifier()
    start = time.process_time()
    classifier.feed_all(parse_lines(text).records, 0.0)
    return len(text) / (time.process_time() - start)


def _timed(cmd: list[str]) -> float:
    """Wall time of a single-threaded command (os.times() ticks are too coarse for it). Its output goes to a
    pipe: GNU grep stops at the first match when it sees /dev/null."""
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.PIPE, check=False)
    return time.perf_counter() - start


def rates_of(rev: str, lines: int, rounds: int) -> tuple[list[float], list[float], list[float]]:
    """(benign, mix) lines/s and a storm line's CPU seconds (storm_cost) of each round of the classifier of commit
    `rev`, run on the same lines by this script in a child whose `gpuwarden` is that commit's `src/` (the lines come
    from this tree's corpus and the same seed)."""
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(root), "archive", rev, "src"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        out = subprocess.run([sys.executable, __file__, "--rates-only", "--lines", str(lines), "--rounds", str(rounds)],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": f"{tmp}/src"}).stdout
    benign, mix, *storm = json.loads(out)  # an older bench printed no storm costs
    return benign, mix, storm[0] if storm else []


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def write_kmsg(text: str) -> None:
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(f"<3>{text}\n")


class Follower:
    """A shell pipeline that prints the lines it finds (`dmesg -W | grep --line-buffered -E`), read unbuffered: the
    instant a line of it arrives is taken at once (select on its pipe, no reader's buffer in between)."""

    def __init__(self, command: str) -> None:
        self.proc = subprocess.Popen(command, shell=True, stdout=subprocess.PIPE, start_new_session=True)
        self.fd = self.proc.stdout.fileno()
        self.pending = b""

    def line(self, text: str, timeout: float) -> bool:
        """Whether the line of `text` (a line that ends with it) arrived within `timeout` seconds; the lines before
        it are dropped (those of earlier writes, a matching line of another writer): only this write's line times it."""
        want, deadline = text.encode(), time.monotonic() + timeout
        while True:
            lines = self.pending.split(b"\n")
            for i, line in enumerate(lines[:-1]):
                if line.endswith(want):
                    self.pending = b"\n".join(lines[i + 1:])
                    return True
            self.pending = lines[-1]
            if not select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                return False
            self.pending += os.read(self.fd, 65536)

    def close(self) -> None:
        os.killpg(self.proc.pid, 15)
        self.proc.wait(10)


DMESG = f"dmesg -W | grep --line-buffered -E '{NAIVE_PATTERN}'"


def gpuwarden_latency(writes: int, source: str, shown: str | None = None,
                      kinds: tuple[str, ...] = tuple(LATENCY_LINES),
                      beside: str | None = None) -> dict[str, list[float]]:
    """Seconds from write to stored row, per kind. `shown`: the source name the daemon logs. `beside`: a pipeline
    (Follower) that follows the same writes: each write is timed to the row and to the pipeline's line, both waited
    for in one select (the row looked for when the store writes, the pipe's line taken as it comes): its times come
    back under "<kind> beside". The row was polled every 0.5 ms before: an error of up to 0.5 ms against gpuwarden
    alone."""
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gw.toml"
        config.write_text(f'[daemon]\nstate_dir = "{tmp}"\n[exporter]\nenabled = false\n'
                          f'[kernel]\nsource = "{source}"\nlookback = "0s"\nstorm_window = "0s"\n')
        log = Path(tmp) / "stderr.log"
        with log.open("w") as stderr:
            daemon = subprocess.Popen([sys.executable, "-m", "gpuwarden", "--config", str(config), "run"],
                                      stderr=stderr)
        try:
            _wait(lambda: f"kernel source: {shown or source}" in log.read_text() or daemon.poll() is not None, 30,
                  f"the daemon to open its {source} source")
            if daemon.poll() is not None:
                raise SystemExit(f"kernel_bench: the daemon exited ({daemon.returncode}):\n{log.read_text()}")
            db = sqlite3.connect(f"file:{tmp}/gpuwarden.db?mode=ro", uri=True, isolation_level=None)
            last = db.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0]
            latencies: dict[str, list[float]] = {kind: [] for kind in kinds}
            writes_seen = FolderWrites(tmp)
            follower = Follower(beside) if beside else None
            if follower:
                time.sleep(1.0)  # the pipeline at the log's end
                latencies |= {f"{kind} beside": [] for kind in kinds}
            try:
                for i in range(writes):
                    kind = kinds[i % len(kinds)]
                    text = LATENCY_LINES[kind].format(i=i)
                    start = time.perf_counter()
                    write_kmsg(text)
                    # Both are waited for in one select: the pipeline's line as it comes, the row once the store
                    # has written in its folder (a commit's pages go to the WAL; the WAL's index, in shared memory,
                    # follows without a file event: the row is then looked for every 50 µs until it is there)
                    row, printed, written = None, follower is None, False
                    while row is None or not printed:
                        if row is None and (row := _newer(db, last)):
                            latencies[kind].append(time.perf_counter() - start)
                        if not printed and follower.line(text, 0.0):
                            printed = True
                            latencies[f"{kind} beside"].append(time.perf_counter() - start)
                        if row is None and written:
                            select.select([] if printed else [follower.fd], [], [], 0.00005)
                        elif row is None or not printed:
                            waits = [writes_seen.fd] if row is None else []
                            ready = select.select(waits + ([] if printed else [follower.fd]), [], [], 0.05)[0]
                            written = writes_seen.fd in ready
                            writes_seen.drain()
                        if time.perf_counter() - start > 10:
                            raise SystemExit(f"kernel_bench: write {i} not in the store ({source} source) or not "
                                             f"printed by `{beside}` within 10 s")
                    last = row
                    time.sleep(0.01)
            finally:
                writes_seen.close()
                if follower:
                    follower.close()
            return latencies
        finally:
            daemon.terminate()
            daemon.wait(10)


class FolderWrites:
    """inotify on a folder: its fd is readable once any file in it was written (IN_MODIFY), so that a row is looked
    for when the store has written, the moment it has, as the pipeline's line is taken the moment it comes."""

    IN_MODIFY, IN_NONBLOCK, IN_CLOEXEC = 0x2, 0o4000, 0o2000000

    def __init__(self, folder: str) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(self.IN_NONBLOCK | self.IN_CLOEXEC)
        if self.fd < 0 or libc.inotify_add_watch(self.fd, folder.encode(), self.IN_MODIFY) < 0:
            raise OSError(ctypes.get_errno(), f"inotify on {folder}")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.fd, 65536):
                pass

    def close(self) -> None:
        os.close(self.fd)


def _newer(db: sqlite3.Connection, after: int) -> int | None:
    row = db.execute("SELECT max(id) FROM events").fetchone()[0]
    return row if row and row > after else None


def _wait(predicate, timeout: float, what: str, poll: float = 0.05):
    """The predicate's first true value, or a clear exit when it never comes (a source that never becomes
    ready, a journald that is not running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(poll)
    raise SystemExit(f"kernel_bench: gave up after {timeout:.0f} s waiting for {what}")


def naive_latency(writes: int) -> list[float]:
    pipeline = Follower(f"journalctl -kf -n0 -o cat | grep --line-buffered -E '{NAIVE_PATTERN}'")
    try:
        time.sleep(1.0)  # let journalctl reach the tail
        latencies = []
        for i in range(writes):
            text = f"amdgpu ffff:fe:1f.7: amdgpu: ring gfx_0.0.0 timeout, signaled seq={i}"
            start = time.perf_counter()
            write_kmsg(text)
            if not pipeline.line(text, 5):  # its own line: another writer's matching line times nothing
                raise RuntimeError("journalctl | grep printed nothing within 5 s")
            latencies.append(time.perf_counter() - start)
            time.sleep(0.01)
        return latencies
    finally:
        pipeline.close()


@contextlib.contextmanager
def journald_running():
    """A running systemd-journald for the latency runs: the one already there, or one started here."""
    started = None
    if subprocess.run(["pgrep", "-x", "systemd-journal"], capture_output=True).returncode != 0:
        started = subprocess.Popen([JOURNALD], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
    try:
        yield
    finally:
        if started:
            started.terminate()
            started.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=300_000)
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds of the throughput runs")
    parser.add_argument("--against", metavar="REV", help="also time the classifier of this commit")
    parser.add_argument("--rates-only", action="store_true", help=argparse.SUPPRESS)  # a child of --against
    args = parser.parse_args()
    rng = random.Random(7)
    benign, mix = benign_lines(args.lines, rng), mix_lines(args.lines, rng)
    if args.rates_only:
        rounds = interleaved(benign, mix, args.rounds, grep=False)
        print(json.dumps([rounds.benign, rounds.mix, [storm_cost() for _ in range(args.rounds)]]))
        return

    print(f"## Classifier throughput ({args.lines:,} lines, one core, CPU time; median (min–max) of {args.rounds} "
          "interleaved rounds)\n")
    print("| what | lines/s | events |\n|---|---:|---:|")
    loaded = load()
    rounds = interleaved(benign, mix, args.rounds)
    print(f"| gpuwarden classifier, benign lines | {spread(rounds.benign)} | {rounds.benign_events} |")
    print(f"| `grep -E -c` with a fault pattern, benign lines (wall time) | {spread(rounds.grep)} | (matching lines, "
          "no events) |")
    print(f"| gpuwarden classifier, mix (1 % faults in storms of 50) | {spread(rounds.mix)} | {rounds.mix_events} |")
    print(f"| gpuwarden parse `dmesg` text + classify, mix (one run) | {parse_and_classify_rate(mix):,.0f} | |")
    storm, unique = [], []
    for _ in range(args.rounds):  # interleaved
        storm.append(storm_cost())
        unique.append(storm_cost(unique=True))
    print(f"| gpuwarden classifier, a fault line joining its storm's open burst (µs CPU a line) | "
          f"{statistics.median(storm) * 1e6:.1f} ({min(storm) * 1e6:.1f}–{max(storm) * 1e6:.1f}) | |")
    print(f"| the same, every line's text a new one (µs CPU a line) | "
          f"{statistics.median(unique) * 1e6:.1f} ({min(unique) * 1e6:.1f}–{max(unique) * 1e6:.1f}) | |")
    benign_rate, grep_rate = statistics.median(rounds.benign), statistics.median(rounds.grep)
    figure("classifier, benign lines, one core", benign_rate, "lines/s",
           f"`grep -E -c` {grep_rate:,.0f} lines/s (finds lines, makes no events): "
           f"{benign_rate / grep_rate:.2f}×; medians of {args.rounds} interleaved rounds, the classifier's "
           f"{min(rounds.benign):,.0f}–{max(rounds.benign):,.0f} ({loaded} before, {load()} after)",
           "≥ 2,500,000 lines/s (≥ 0.5× grep -E)", benign_rate >= 2_500_000 or benign_rate >= 0.5 * grep_rate)
    flood = statistics.median(storm) * 50_000
    figure("classifier, a flood of 50,000 fault lines/s joining open bursts", flood, "cores",
           f"{statistics.median(storm) * 1e6:.1f} µs a line ({min(storm) * 1e6:.1f}–{max(storm) * 1e6:.1f}), 50 texts "
           f"a kind; every text new: {statistics.median(unique) * 1e6:.1f} µs ({statistics.median(unique) * 5e4:.2f} "
           f"of a core); a benign line {1e6 / benign_rate:.2f} µs; one core, CPU time, classifier only ({load()})",
           "≤ 0.15 of a core",
           flood <= 0.15)
    if args.against:
        old_benign, old_mix, old_storm = rates_of(args.against, args.lines, args.rounds)
        print(f"| classifier of {args.against}, benign lines | {spread(old_benign)} | |")
        print(f"| classifier of {args.against}, mix | {spread(old_mix)} | |")
        if old_storm:
            print(f"| classifier of {args.against}, a storm's fault line (µs CPU a line) | "
                  f"{statistics.median(old_storm) * 1e6:.1f} ({min(old_storm) * 1e6:.1f}–"
                  f"{max(old_storm) * 1e6:.1f}) | |")

    if args.writes <= 0:
        return
    if os.geteuid() != 0 or not shutil.which("journalctl") or not Path(JOURNALD).exists():
        print("\n(latency needs root and journald: skipped)")
        return
    print(f"\n## Latency from a /dev/kmsg write to the event ({args.writes} writes)\n")
    print("| what, kind | median ms | p99 ms | max ms |\n|---|---:|---:|---:|")
    runs = (("gpuwarden, `auto` under journald (kmsg live, journal catch-up): row visible in the store",
             lambda: gpuwarden_latency(args.writes, "auto", "kmsg (journal catch-up)", beside=DMESG)),
            ("gpuwarden, kmsg source: row visible in the store",
             lambda: gpuwarden_latency(args.writes, "kmsg", beside=DMESG)),
            # journald takes `NVRM:` of a line written from user space for a syslog identifier and keeps the rest
            # as its message (a kernel line keeps it whole): the journal alone is timed on the AMD lines
            ("gpuwarden, journal source: row visible in the store",
             lambda: gpuwarden_latency(args.writes, "journal", kinds=("ring_timeout (held)", "sq_intr"))),
            ("`journalctl -kf \\| grep --line-buffered -E` prints it", lambda: naive_latency(args.writes)))
    with journald_running():
        results = [(name, run()) for name, run in runs]
    for name, values in results:
        for kind, seconds in values.items() if isinstance(values, dict) else (("all", values),):
            ms = [v * 1000 for v in seconds]
            what = f"`{DMESG}` prints it, the same writes, {kind[:-len(' beside')]}" if kind.endswith(" beside") \
                else f"{name}, {kind}"
            print(f"| {what} | {statistics.median(ms):.2f} | {percentile(ms, 99):.2f} | {max(ms):.2f} |")
    naive = [v * 1000 for v in results[-1][1]]
    auto = results[0][1]  # `auto`, the default source, with `dmesg -W | grep -E` following the same writes
    for kind in LATENCY_LINES:
        ms, beside = [v * 1000 for v in auto[kind]], [v * 1000 for v in auto[f"{kind} beside"]]
        p99, alternative = percentile(ms, 99), percentile(beside, 99)
        figure(f"kmsg write → stored event p99, {kind}", p99, "ms",
               f"`dmesg -W | grep -E` prints the same writes: p99 {alternative:.2f} ms ({p99 / alternative:.2f}×; "
               f"medians {statistics.median(ms):.2f} and {statistics.median(beside):.2f} ms, each write timed to both "
               f"in one loop); `journalctl -kf | grep` p99 {percentile(naive, 99):.1f} ms ({load()})",
               "≤ 1.0× `dmesg -W | grep -E`", p99 <= alternative)


if __name__ == "__main__":
    main()
