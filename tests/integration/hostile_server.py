"""A hostile HTTP server on loopback for fault-injection tests, as a real process:

    python hostile_server.py PORT slowloris      # headers at once, then the body one byte a second, forever
    python hostile_server.py PORT body FILE      # FILE as the body of every GET (e.g. a huge /metrics)
    python hostile_server.py PORT silent         # reads the request and never answers (a hung receiver)

It prints "ready" once it listens. Every connection gets its own thread.
"""

import contextlib
import socket
import sys
import threading
import time
from pathlib import Path


def serve(conn: socket.socket, mode: str, body: bytes) -> None:
    with conn, contextlib.suppress(OSError):  # the client hung up: that is what clients of this server do
        conn.recv(65536)
        if mode == "silent":
            time.sleep(3600)
        elif mode == "slowloris":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n")
            for _ in range(100000):
                conn.sendall(b"#")
                time.sleep(1)
        else:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                         + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)


def main() -> None:
    port, mode = int(sys.argv[1]), sys.argv[2]
    body = Path(sys.argv[3]).read_bytes() if mode == "body" else b""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(16)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve, args=(conn, mode, body), daemon=True).start()


if __name__ == "__main__":
    main()
