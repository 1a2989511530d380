"""A stand-in inference engine for tests: a real process serving /metrics over loopback with live counters,
seeded from a real dump in the test corpus. POST /mode/<mode> switches what it does:

- progress: 2 requests running, 40 tokens a second, a request of 0.3 s finishing every 0.3 s
- stall: requests running, counters frozen (with --spin, a child process spins a core meanwhile)
- idle: nothing running
- slow: 1 request running, one token a second (slower than its scrapes, well inside a 2 s floor: seen at
  0.5 s scrapes, the gaps are 1 to 1.5 s)
- hang: /metrics stops answering (the handler sleeps)

It serves a one-token completion (/v1/models, /v1/completions: the canary) while it progresses or idles, and
holds it forever while stalled or hung. --loading SECONDS answers every request 503 "Loading model" for that
long after its start, as an engine that loads its model (llama.cpp does so; vLLM does not listen yet).

With --api-key KEY, or $VLLM_API_KEY set (as vLLM reads it: not on the command line, where the canary finds
it), /v1/* answers 401 to a request without `Authorization: Bearer <key>`, as `vllm serve --api-key` does.

--orphans forks a child that forks a grandchild and exits (the grandchild is orphaned); --ignore-term makes
every process of the tree ignore SIGTERM; --pids FILE records the pids of the whole tree; --scrapes FILE the time of
each GET /metrics.
"""

import argparse
import http.server
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

_SPIN = "import os, contextlib\nwith contextlib.suppress(OSError): os.nice(-10)\nwhile True: pass"

LIVE = {  # profile -> (running, waiting, generated, latency histogram)
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total",
             "vllm:e2e_request_latency_seconds"),
    "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:generation_tokens_total",
               "sglang:e2e_request_latency_seconds"),
    "llamacpp": ("llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:tokens_predicted_total",
                 None),
}


class Engine:
    def __init__(self, dump: str, profile: str):
        with open(dump) as f:
            self.lines = f.read().splitlines()
        self.names = LIVE[profile]
        self.mode, self.running, self.tokens, self.lat_sum, self.lat_count = "progress", 2.0, 1000.0, 0.0, 0.0
        self.lock = threading.Lock()
        self.spinner = None

    def tick(self, dt: float):
        with self.lock:
            if self.mode == "progress":
                self.running, self.tokens = 2.0, self.tokens + 40 * dt
                self.lat_sum, self.lat_count = self.lat_sum + 0.3 * (dt / 0.3), self.lat_count + dt / 0.3
            elif self.mode == "slow":
                self.running = 1.0
            elif self.mode == "idle":
                self.running = 0.0

    def render(self) -> str:
        running, waiting, generated, latency = self.names
        values = {running: self.running, waiting: 0.0, generated: self.tokens}
        if latency:
            values[f"{latency}_sum"], values[f"{latency}_count"] = self.lat_sum, self.lat_count
        out, seen = [], set()
        for line in self.lines:
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            if name in values and not line.startswith("#"):
                if name not in seen:
                    labels = line[len(name):].rsplit(" ", 1)[0]
                    out.append(f"{name}{labels} {values[name]}")
                    seen.add(name)
            else:
                out.append(line)
        out += [f"{n} {v}" for n, v in values.items() if n not in seen]
        return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dump", required=True)
    p.add_argument("--profile", default="vllm")
    p.add_argument("--mode", default="progress")
    p.add_argument("--spin", action="store_true")
    p.add_argument("--orphans", action="store_true")
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--pids")
    p.add_argument("--host", default="127.0.0.1")  # "::1", "::" (IPv6 only), "0.0.0.0"
    p.add_argument("--loading", type=float, default=0.0)
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"))
    p.add_argument("--scrapes")  # a file each GET /metrics appends its time to (CLOCK_MONOTONIC, the host's)
    p.add_argument("rest", nargs="*")  # e.g. "vllm serve": what discovery looks for in the command line
    args = p.parse_args()
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    engine = Engine(args.dump, args.profile)
    engine.mode = args.mode
    pids = [os.getpid()]
    worker = subprocess.Popen([sys.executable, "-c", "import time, signal, sys\n"
                               + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if args.ignore_term else "")
                               + "while True: time.sleep(1)"])
    pids.append(worker.pid)
    if args.orphans:
        r, w = os.pipe()
        if os.fork() == 0:  # child: fork the grandchild, tell its pid, exit
            grandchild = os.fork()
            if grandchild == 0:
                if args.ignore_term:
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                while True:
                    time.sleep(1)
            os.write(w, str(grandchild).encode())
            os._exit(0)
        pids.append(int(os.read(r, 32)))
        os.wait()

    def set_mode(mode):
        with engine.lock:
            engine.mode = mode
        if mode == "stall" and args.spin and engine.spinner is None:
            # it asks for a core (root may): at nice 0 beside two test workers on a 2-core box it read 25-70 %
            engine.spinner = subprocess.Popen([sys.executable, "-c", _SPIN])
            with open(args.pids, "a") as f:
                f.write(f"{engine.spinner.pid}\n")

    loaded_at = time.monotonic() + args.loading
    key = args.api_key

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self, status, body, kind="application/json"):
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def refused(self):
            if key and self.path.startswith("/v1/") and self.headers.get("Authorization") != f"Bearer {key}":
                self.answer(401, b'{"error": "Unauthorized"}')
                return True
            return False

        def loading(self):
            if time.monotonic() < loaded_at:
                self.answer(503, b'{"error": {"code": 503, "message": "Loading model"}}')
                return True
            return False

        def do_GET(self):
            if args.scrapes and not self.path.startswith("/v1/"):
                with open(args.scrapes, "a") as f:
                    f.write(f"{time.monotonic():.6f}\n")
            if self.loading() or self.refused():
                return
            if engine.mode == "hang":
                time.sleep(3600)
            if self.path == "/v1/models":
                self.answer(200, b'{"data": [{"id": "fake"}]}')
                return
            self.answer(200, engine.render().encode(), "text/plain; version=0.0.4")

        def do_POST(self):
            if self.path.startswith("/mode/"):
                set_mode(self.path.rsplit("/", 1)[-1])
                self.answer(204, b"")
                return
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.loading() or self.refused():
                return
            if engine.mode in ("stall", "hang"):
                time.sleep(3600)  # a stuck engine's completion never returns
            self.answer(200, b'{"choices": [{"text": "x"}]}')

        def log_message(self, *a):
            pass

    class Server(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in args.host else socket.AF_INET

        def server_bind(self):
            if self.address_family == socket.AF_INET6:  # IPv6 alone, beside another's IPv4 socket on the port
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            super().server_bind()

    server = Server((args.host, args.port), Handler)
    server.daemon_threads = True
    if args.pids:
        with open(args.pids, "w") as f:
            f.write("".join(f"{pid}\n" for pid in pids))
    set_mode(args.mode)

    def ticker():
        step = int(time.time())
        while True:
            time.sleep(0.1)
            engine.tick(0.1)
            # slow: a token on every second's boundary passed since the last tick, however late this tick came (on
            # a loaded box a tick can take longer than 0.1 s: a boundary in the gap was lost). It was one every 1.5 s
            # against a 2 s floor: seen at 0.5 s scrapes a gap was up to 2 s, a stall at the least jitter.
            now = int(time.time())
            if engine.mode == "slow" and now != step:
                with engine.lock:
                    engine.tokens += 1
            step = now

    threading.Thread(target=ticker, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
