"""The canary against a fake Ollama and a fake SGLang on loopback (no real Ollama can run here: it needs a model
download; nor SGLang: PyPI's sgl-kernel is a CUDA build), and where a discovered engine's log is. Real engines'
canaries are in tests/integration/test_real_engines_logs.py."""

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuwarden import enginekinds
from gpuwarden.engine.canary import api_for, canary
from gpuwarden.engine.discovery import unit_of
from gpuwarden.enginekinds import sglang


class Loopback:
    """An HTTP server on a free loopback port, answered by `handler`, until close()."""

    def serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        handler.log_message = lambda *args: None
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class FakeOllama(Loopback):
    """/api/ps lists `loaded`; /api/generate answers at once, or after `delay` seconds."""

    def __init__(self, loaded=("tiny:latest",), delay=0.0):
        fake = self
        self.loaded, self.delay, self.generated = list(loaded), delay, []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                assert self.path == "/api/ps"
                self._send({"models": [{"name": n, "model": n} for n in fake.loaded]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.generated.append((self.path, body))
                time.sleep(fake.delay)
                self._send({"model": body["model"], "response": "x", "done": True})

            def _send(self, obj):
                data = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.serve(Handler)


@pytest.fixture
def ollama():
    made = []

    def make(**kw):
        made.append(FakeOllama(**kw))
        return made[-1]
    yield make
    for fake in made:
        fake.close()


def test_ollama_canary_generates_one_token_with_a_loaded_model(ollama):
    fake = ollama()
    result = asyncio.run(canary(fake.url, api_for("auto", "ollama"), 5))
    assert result.outcome == "ok"
    path, body = fake.generated[0]
    assert path == "/api/generate" and body["model"] == "tiny:latest" and body["options"] == {"num_predict": 1}
    assert body["stream"] is False


def test_ollama_canary_never_loads_a_model(ollama):
    fake = ollama(loaded=())
    assert asyncio.run(canary(fake.url, api_for("ollama", "auto"), 5)).outcome == "skipped"
    assert fake.generated == []


def test_a_completion_that_does_not_return_in_time_is_a_timeout(ollama):
    fake = ollama(delay=3)
    started = time.monotonic()
    result = asyncio.run(canary(fake.url, api_for("ollama", "auto"), 1))
    assert result.outcome == "timeout" and result.detail == "a real completion did not return in 1 s"
    assert time.monotonic() - started < 2.5


def test_a_refused_connection_is_tried_until_the_deadline_then_a_timeout():
    result = asyncio.run(canary("http://127.0.0.1:9", api_for("openai", "auto"), 1))  # port 9: nothing listens
    assert result.outcome == "timeout" and "ConnectError" in result.detail


def test_the_api_follows_the_profile():
    assert [api_for("auto", p).name for p in ("vllm", "sglang", "tgi", "llamacpp", "ollama")] == [
        "openai", "sglang", "openai", "llamacpp", "ollama"]
    assert api_for("openai", "llamacpp").name == "openai"


def test_a_discovered_engines_unit_comes_from_its_cgroup(tmp_path):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text("0::/system.slice/ollama.service\n")
    (tmp_path / "43").mkdir()
    (tmp_path / "43" / "cgroup").write_text("0::/user.slice/user-1000.slice/session-2.scope\n")
    assert unit_of(42, tmp_path) == "ollama.service" and unit_of(43, tmp_path) is None
    assert unit_of(44, tmp_path) is None
    assert all(k.more and k.commands for k in enginekinds.all_kinds())  # each kind discovered says what to switch on


class FakeSGLang(Loopback):
    """/health_generate as sglang/srt/entrypoints/http_server.py (sgl-project/sglang@0025436e) answers it: 200
    once the scheduler answered; 503 after its own deadline (it polls once a second, so never before 1 s) when
    nothing came back; 503 at once while the server starts."""

    def __init__(self, answer: str):
        fake = self
        self.answer, self.paths = answer, []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                fake.paths.append(self.path)
                if fake.answer == "stuck":
                    time.sleep(1.2)  # SGLANG_HEALTH_CHECK_TIMEOUT, shortened: nothing came back from the scheduler
                self.send_response({"ok": 200, "stuck": 503, "starting": 503}[fake.answer])
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.serve(Handler)


@pytest.mark.parametrize(("answer", "waited", "outcome"), [
    ("ok", 5.0, "ok"), ("stuck", 1.0, "timeout"), ("starting", 1.0, "error"),
    ("stuck", 5.0, "error"),  # a 503 sooner than SGLang's own deadline could be a slow start: no kill
])
def test_sglang_canary_is_its_own_health_generation(monkeypatch, answer, waited, outcome):
    monkeypatch.setattr(sglang, "WAITED", waited)  # the fake's deadline is 1.2 s, not SGLang's 20 s
    fake = FakeSGLang(answer)
    try:
        result = asyncio.run(canary(fake.url, api_for("auto", "sglang"), 5))
    finally:
        fake.close()
    assert fake.paths == ["/health_generate"]
    assert result.outcome == outcome, result
    if outcome == "timeout":
        assert "got no token back: HTTP 503" in result.detail


class FakeOpenAI(Loopback):
    """An OpenAI-compatible server that wants `key` (401 without it, as `vllm serve --api-key`), serves the model
    `tiny` at /v1/completions and /v1/chat/completions, and 404 for anything else."""

    def __init__(self, key="k3y"):
        fake = self
        self.asked = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self._answer(None)

            def do_POST(self):
                self._answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

            def _answer(self, body):
                fake.asked.append((self.path, body, self.headers.get("X-Tenant")))
                if self.headers.get("Authorization") != f"Bearer {key}":
                    status, out = 401, {"error": "Unauthorized"}
                elif self.path == "/v1/models":
                    status, out = 200, {"data": [{"id": "tiny"}]}
                elif self.path in ("/v1/completions", "/v1/chat/completions") and body["model"] == "tiny":
                    status, out = 200, {"choices": [{"text": "x"}]}
                else:
                    status, out = 404, {"error": "not found"}
                data = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.serve(Handler)


@pytest.fixture
def openai():
    fake = FakeOpenAI()
    yield fake
    fake.close()


def test_a_canary_without_the_engines_key_is_misconfigured_and_says_what_to_set(openai):
    from gpuwarden.config.schema import Secret
    from gpuwarden.engine.canary import Client

    result = asyncio.run(canary(openai.url, api_for("auto", "vllm"), 5))
    assert result.outcome == "misconfigured"
    assert result.detail.startswith("HTTP 401 at /v1/models: the engine wants an API key; set canary_api_key_file")
    wrong = Client(Secret("nope"), key_from="from /etc/gpuwarden/x.key")
    result = asyncio.run(canary(openai.url, api_for("auto", "vllm"), 5, wrong))
    assert result.outcome == "misconfigured" and "refused the API key from /etc/gpuwarden/x.key" in result.detail
    assert "nope" not in result.detail
    right = Client(Secret("k3y"), (("X-Tenant", "ops"),))
    assert asyncio.run(canary(openai.url, api_for("auto", "vllm"), 5, right)).outcome == "ok"
    assert openai.asked[-1] == ("/v1/completions", {"model": "tiny", "prompt": [1], "max_tokens": 1}, "ops")


def test_a_canary_speaks_the_model_and_route_it_is_given_and_a_404_names_them(openai):
    from gpuwarden.config.schema import Secret
    from gpuwarden.engine.canary import Client

    chat = Client(Secret("k3y"), model="tiny", route="/v1/chat/completions")
    assert asyncio.run(canary(openai.url, api_for("auto", "llamacpp"), 5, chat)).outcome == "ok"
    path, body, _ = openai.asked[-1]
    assert len(openai.asked) == 1 and path == "/v1/chat/completions" and body["messages"] and body["max_tokens"] == 1
    unknown = Client(Secret("k3y"), model="qwen-72b")
    result = asyncio.run(canary(openai.url, api_for("auto", "vllm"), 5, unknown))
    assert result.outcome == "misconfigured" and result.detail.startswith(
        "HTTP 404 at /v1/completions: the engine has no such route or model; set canary_model")


def test_the_key_on_an_engines_command_line_is_found_and_never_shown():
    from gpuwarden.engine.canary import key_in
    from gpuwarden.runtime.logsetup import redact

    assert key_in(["vllm", "serve", "m", "--api-key", "s3cret"]) == "s3cret"
    assert key_in(["llama-server", "--api-key=s3cret"]) == "s3cret"
    assert key_in(["vllm", "serve", "m", "--api-key-file", "/k"]) is None and key_in(["x", "--api-key"]) is None
    assert redact("1 root vllm serve m --api-key s3cret --port 8000") == "1 root vllm serve m --api-key *** --port 8000"
    assert redact("llama-server --api-key=s3cret") == "llama-server --api-key=***"
