"""The exporter behind node_exporter's web config (`[exporter] web_config_file`): a real TLS client against a
self-signed certificate made here with openssl, real basic auth (401 without, 200 with) on /metrics and on the
status page, the metrics still clean for promtool; `check` refuses a file `run` could not serve with."""

import ssl
import subprocess

import bcrypt
import httpx
import pytest
from helpers import GPUWARDEN, free_port, need, wait_for

PASSWORD = "correct horse"


@pytest.fixture
def tls(tmp_path):
    """A self-signed certificate for 127.0.0.1 and its key, made by the real openssl."""
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    subprocess.run([need("openssl", "openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


def web_config(tmp_path, cert="server.crt", key="server.key", hashed=None):
    hashed = hashed or bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    path = tmp_path / "web.yml"
    path.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
                    f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    return path


def guarded_daemon(daemon_factory, tmp_path):
    """A running daemon whose exporter takes the web config of web_config()."""
    d = daemon_factory("[guard]\nenabled = false\n[gpu]\nnvml = false\n")
    d.config_path.write_text(d.config_path.read_text().replace(
        f"[exporter]\nport = {d.port}\n", f'[exporter]\nport = {d.port}\nweb_config_file = "{web_config(tmp_path)}"\n'))
    d.start()
    d.wait_log("gpuwarden running", 30)
    return d


def test_tls_and_basic_auth_guard_metrics_and_the_status_page(daemon_factory, tmp_path, tls):
    cert, _ = tls
    d = guarded_daemon(daemon_factory, tmp_path)
    url = f"https://127.0.0.1:{d.port}"
    trust = ssl.create_default_context(cafile=str(cert))  # checks the chain and the name: real TLS
    with httpx.Client(verify=trust, timeout=10) as client:
        assert client.get(f"{url}/metrics").status_code == 401
        refused = client.get(f"{url}/metrics", auth=("prometheus", "wrong"))
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == 'Basic realm="gpuwarden"'
        assert client.get(f"{url}/status", auth=("nobody", PASSWORD)).status_code == 401
        metrics = client.get(f"{url}/metrics", auth=("prometheus", PASSWORD))
        assert metrics.status_code == 200 and "process_cpu_seconds_total" in metrics.text
        page = client.get(f"{url}/", auth=("prometheus", PASSWORD))
        assert page.status_code == 200 and "<html" in page.text.lower()
    with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port gets no answer
        httpx.get(f"http://127.0.0.1:{d.port}/metrics", timeout=5)
    with pytest.raises(httpx.ConnectError):  # nor a client that does not trust the certificate
        httpx.get(f"{url}/metrics", timeout=5)
    lint = subprocess.run([need("promtool"), "check", "metrics"], input=metrics.text, capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout + lint.stderr
    web_config(tmp_path, hashed=bcrypt.hashpw(b"renewed", bcrypt.gensalt(4)).decode())  # a changed password
    done = subprocess.run([*GPUWARDEN, "reload", "--pid", str(d.proc.pid), "--timeout", "20"], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    with httpx.Client(verify=trust, timeout=10) as client:  # the reload read the file again
        assert client.get(f"{url}/metrics", auth=("prometheus", PASSWORD)).status_code == 401
        assert client.get(f"{url}/metrics", auth=("prometheus", "renewed")).status_code == 200
    assert d.stop() == 0


@pytest.mark.parametrize(("make", "said"), [
    (lambda tmp: web_config(tmp, cert="missing.crt"), "tls_server_config.cert_file: {tmp}/missing.crt: no such file"),
    (lambda tmp: web_config(tmp, hashed="$2b$10$tooshort"), "basic_auth_users.prometheus: not a bcrypt hash"),
    (lambda tmp: web_config(tmp, key="server.crt"), "tls_server_config: the certificate and key do not load together"),
    (lambda tmp: (tmp / "web.yml").write_text("tls_server_config:\n  cert_file: a\n  key_file: b\n"
                                              "  client_ca_file: c\n") and tmp / "web.yml",
     "tls_server_config takes cert_file and key_file, both, nothing else"),
], ids=["missing-cert", "bad-hash", "unusable-key", "unsupported-option"])
def test_check_refuses_a_web_config_run_could_not_serve_with(tmp_path, tls, make, said):
    path = make(tmp_path)
    config = tmp_path / "gw.toml"
    config.write_text(f'[exporter]\nport = 10440\nweb_config_file = "{path}"\n')
    result = subprocess.run([*GPUWARDEN, "check", str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 78, result.stdout + result.stderr
    assert f":3: exporter.web_config_file: {path}: " + said.format(tmp=tmp_path) in result.stderr, result.stderr


def test_prometheus_scrapes_it_over_tls_with_basic_auth(daemon_factory, tmp_path, tls):
    """The real Prometheus, configured as docs/metrics.md says, scrapes the guarded exporter."""
    cert, _ = tls
    d = guarded_daemon(daemon_factory, tmp_path)
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: gpuwarden\n    scheme: https\n"
        f"    tls_config: {{ca_file: '{cert}'}}\n    basic_auth: {{username: prometheus, password: '{PASSWORD}'}}\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{d.port}']}}]\n")
    server = subprocess.Popen(
        [need("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'db'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def up():
            try:
                data = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": "up"}, timeout=2).json()
            except (httpx.HTTPError, ValueError):
                return None
            return data["data"]["result"]
        [series] = wait_for(up, 60, interval=0.5, what="Prometheus to scrape the exporter once")
        assert series["value"][1] == "1", series  # 0 would be a failed scrape: TLS or the password refused
    finally:
        server.terminate()
        server.wait(10)
    assert d.stop() == 0
