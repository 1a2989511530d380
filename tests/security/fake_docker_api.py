"""A would-be Docker Engine API on a unix socket that names any pid as container "engine"'s: what someone who can
put a listener where gpuwarden looks for dockerd would serve. Usage: fake_docker_api.py SOCKET PID."""

import http.server
import json
import socketserver
import sys

SOCKET, PID = sys.argv[1], sys.argv[2]
ID = "e" * 64


class API(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        answers = {"/containers/engine/json": {"Id": ID, "State": {"Running": True, "Pid": int(PID)},
                                               "Config": {"Tty": False}},
                   f"/containers/{ID}/top?ps_args=-o+pid": {"Titles": ["PID"], "Processes": [[PID]]}}
        body = json.dumps(answers.get(self.path, {"message": "no such container"})).encode()
        self.send_response(200 if self.path in answers else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

    def address_string(self):
        return "docker"


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


Server(SOCKET, API).serve_forever()
