"""What a local user can serve on loopback to mislead root's gpuwarden. Usage: impostor_server.py PORT MODE [FILE]
[anything else: only shown in the command line, e.g. "vllm serve" for discovery to find it].

- exporter: /metrics says it is a healthy gpuwarden (its build info, every component up, the store writable)
- drip: every answer comes one byte every half second, forever (each read is quick, the whole never ends)
- engine: /metrics is FILE (an engine's dump, unchanging); every other path answers a 200 of 400 MB at once
- list: /metrics is FILE; every other path answers the JSON `[]` (valid, of no shape an API has)
- file: every path answers FILE (a status snapshot of the user's making, say)
"""

import http.server
import itertools
import sys
import time
from pathlib import Path

PORT, MODE = int(sys.argv[1]), sys.argv[2]
FILE = sys.argv[3] if len(sys.argv) > 3 else None
GPUWARDEN = (b'# TYPE gpuwarden_build_info gauge\ngpuwarden_build_info{version="0.1.0"} 1\n'
             b'# TYPE gpuwarden_component_up gauge\ngpuwarden_component_up{component="kernel"} 1\n'
             b'# TYPE gpuwarden_store_writable gauge\ngpuwarden_store_writable 1\n')
HUGE, CHUNK = 400 << 20, b"x" * (1 << 20)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def handle_one_request(self):
        if MODE == "drip":  # before the request is even read: every client waits on the status line
            for byte in itertools.chain(b"HTTP/1.0 200 OK\r\nX-Drip: ", itertools.repeat(ord("y"))):
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.5)
        super().handle_one_request()

    def do_GET(self):
        if MODE == "exporter":
            self.answer(GPUWARDEN)
        elif MODE == "file" or self.path == "/metrics":
            self.answer(Path(FILE).read_bytes())
        elif MODE == "list":
            self.answer(b"[]")
        else:
            self.send_response(200)
            self.send_header("Content-Length", str(HUGE))
            self.end_headers()
            for _ in range(HUGE // len(CHUNK)):
                self.wfile.write(CHUNK)

    def answer(self, body: bytes):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
server.daemon_threads = True
server.serve_forever()
