"""A stand-in for the made-up engine "ToyLLM" of docs/engines.md ("Adding an engine kind"): a real process whose
command line says `toyllm serve`, serving ToyLLM's /metrics over loopback with live counters and its own
completion API (POST /generate). POST /mode/<mode> switches what it does: idle (nothing running), progress (2
requests, a step every 0.1 s), stall (2 requests, counters frozen, a completion never returns). GET /calls: the
completions asked of it so far."""

import argparse
import http.server
import json
import threading
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mode", default="idle")
    p.add_argument("rest", nargs="*")  # "toyllm serve": what discovery looks for
    args = p.parse_args()
    state = {"mode": args.mode, "steps": 0, "tokens": 0, "calls": 0}
    lock = threading.Lock()

    def metrics() -> bytes:
        with lock:
            running = 0 if state["mode"] == "idle" else 2
            return (f"# TYPE toyllm:requests_running gauge\ntoyllm:requests_running {running}\n"
                    f"toyllm:requests_waiting 0\ntoyllm:steps_total {state['steps']}\n"
                    f"toyllm:generated_tokens_total {state['tokens']}\n").encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self, status, body, kind="application/json"):
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/metrics":
                self.answer(200, metrics(), "text/plain; version=0.0.4")
            elif self.path == "/calls":
                self.answer(200, str(state["calls"]).encode())
            else:
                self.answer(404, b"{}")

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.startswith("/mode/"):
                with lock:
                    state["mode"] = self.path.rsplit("/", 1)[-1]
                self.answer(204, b"")
            elif self.path == "/generate" and json.loads(body).get("max_new_tokens") == 1:
                with lock:
                    state["calls"] += 1
                    stalled = state["mode"] == "stall"
                if stalled:
                    time.sleep(3600)  # a stuck engine's completion never returns
                with lock:
                    state["steps"] += 1
                    state["tokens"] += 1
                self.answer(200, b'{"text": "x"}')
            else:
                self.answer(404, b"{}")

        def log_message(self, *a):
            pass

    def ticker():
        while True:
            time.sleep(0.1)
            with lock:
                if state["mode"] == "progress":
                    state["steps"] += 1
                    state["tokens"] += 2

    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    threading.Thread(target=ticker, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
