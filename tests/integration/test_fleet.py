"""Fleet integrations with real parts: the shipped alerting rules under promtool, and end to end through a real
Prometheus and a real Alertmanager delivering to a webhook receiver on loopback."""

import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import yaml
from helpers import TEST_GPU, free_port, http_get, need, wait_for

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "config/prometheus/gpuwarden-rules.yml"
SCRAPE = ROOT / "config/prometheus/prometheus.yml"
ALERTMANAGER = ROOT / "config/alertmanager/alertmanager.yml"
# The only change to the shipped rules: GpuwardenDown waits 2 s, not 2 minutes. Expressions are untouched.
FOR = {"GpuwardenDown": "2s"}
DOCS = "https://github.com/gpuwarden/gpuwarden/blob/main/docs"  # the rules' runbook base unless configured
WIKI = "https://wiki.example.org/gpuwarden"  # a team's own copy of the docs, as an external label names it
LOST = f"Dec 02 16:22:28 host kernel: amdgpu {TEST_GPU}: amdgpu: device lost from bus!\n"


def run(*cmd) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=60)


def test_promtool_unit_tests_of_the_rules_pass():
    result = run(need("promtool"), "test", "rules", ROOT / "tests/data/prometheus-rules.test.yml")
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_amtool_accepts_the_alertmanager_example():
    result = run(need("amtool", "prometheus-alertmanager"), "check-config", ALERTMANAGER)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 inhibit rules" in result.stdout


def test_alertmanager_holds_back_only_the_lost_gpus_alerts(tmp_path):
    """The shipped inhibit rules in a real Alertmanager, fed the alerts of an eight-GPU box with GPU 3 lost
    (its incident, its engine's stall and silence) and, on the same box, GPU 5's engine down in its own
    incident and GPU 6's engine stalled: only GPU 3's are held back, and GPU 5's engine behind its incident.
    (Before: `equal: [instance]`, one lost GPU held back every engine's alert of the box.)"""
    am, port = start_alertmanager(tmp_path, "http://127.0.0.1:9/unused")  # nothing is sent within the test
    try:
        box = {"instance": "box:10440", "job": "gpuwarden", "severity": "critical"}
        alerts = {
            "lost3": {"alertname": "GpuwardenGpuLost", "gpu": "0000:03:00.0"},
            "incident3": {"alertname": "GpuwardenIncident", "gpu": "0000:03:00.0", "engine": "e3", "id": "a"},
            "stalled3": {"alertname": "GpuwardenEngineStalled", "gpu": "0000:03:00.0", "engine": "e3"},
            "down5": {"alertname": "GpuwardenEngineDown", "gpu": "0000:05:00.0", "engine": "e5"},
            "incident5": {"alertname": "GpuwardenIncident", "gpu": "0000:05:00.0", "engine": "e5", "id": "b"},
            "stalled6": {"alertname": "GpuwardenEngineStalled", "gpu": "0000:06:00.0", "engine": "e6"},
            "unwatched7": {"alertname": "GpuwardenEngineUnwatched", "engine": "e7", "severity": "warning"},
        }
        body = json.dumps([{"labels": {**box, **labels}} for labels in alerts.values()]).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v2/alerts", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200

        def states():
            got = json.loads(http_get(f"http://127.0.0.1:{port}/api/v2/alerts", timeout=10))
            if len(got) < len(alerts):
                return None
            named = {next(k for k, v in alerts.items() if v.items() <= a["labels"].items()): a for a in got}
            return {name: bool(a["status"]["inhibitedBy"]) for name, a in named.items()}

        held = wait_for(states, 30, interval=0.2, what="Alertmanager to list the alerts")
        assert held == {"lost3": False, "incident3": True, "stalled3": True, "down5": True, "incident5": False,
                        "stalled6": False, "unwatched7": False}
    finally:
        am.stop()


def test_every_alert_is_documented_as_it_is_in_the_rules():
    """docs/fleet.md's table lists exactly the rules' alerts, each with its severity and `for:`, and its
    runbook_url leads to its own section there (the table once listed alerts the rules no longer had)."""
    rules = {r["alert"]: r for r in yaml.safe_load(RULES.read_text())["groups"][0]["rules"]}
    doc = (ROOT / "docs/fleet.md").read_text()
    table = {m[1]: (m[2], m[3]) for m in re.finditer(r"^\| `(Gpuwarden\w+)` \|.*\| (\w+) \| *(\w*) *\|$", doc, re.M)}
    assert table == {name: (r["labels"]["severity"], r.get("for", "")) for name, r in rules.items()}
    sections = {m[1] for m in re.finditer(r"^#### (Gpuwarden\w+)$", doc, re.M)}
    for name, rule in rules.items():
        assert rule["annotations"].keys() == {"summary", "description", "runbook_url"}, name
        # absolute (a relative URL leads nowhere from a page), at the base the Prometheus' external label
        # gpuwarden_docs names, else the project's docs
        assert rule["annotations"]["runbook_url"] == (f'{{{{ or $externalLabels.gpuwarden_docs "{DOCS}" }}}}'
                                                      f"/fleet.md#{name.lower()}") and name in sections, name
    assert sections == set(rules)


class Server:
    """A real Prometheus or Alertmanager on loopback, stopped after the test."""

    def __init__(self, tmp: Path, name: str, argv: list[str]) -> None:
        self.log = tmp / f"{name}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def ready(port: int, proc: subprocess.Popen, log: Path) -> bool:
    assert proc.poll() is None, log.read_text()
    try:
        http_get(f"http://127.0.0.1:{port}/-/ready")
        return True
    except OSError:
        return False


def start_alertmanager(tmp: Path, webhook: str) -> tuple[Server, int]:
    config = yaml.safe_load(ALERTMANAGER.read_text())
    config["route"].update(group_wait="1s", group_interval="1s")
    for receiver in config["receivers"]:
        for hook in receiver["webhook_configs"]:
            hook["url"] = webhook
    (tmp / "alertmanager.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    server = Server(tmp, "alertmanager", [
        need("prometheus-alertmanager", "prometheus-alertmanager"), f"--config.file={tmp / 'alertmanager.yml'}",
        f"--storage.path={tmp / 'am-data'}", f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address="])  # no gossip port: nothing but loopback
    wait_for(lambda: ready(port, server.proc, server.log), 30, interval=0.2, what="Alertmanager to be ready")
    return server, port


def start_prometheus(tmp: Path, target: int, alertmanager: int) -> tuple[Server, int]:
    rules = yaml.safe_load(RULES.read_text())
    changed = set()
    for rule in rules["groups"][0]["rules"]:
        if rule["alert"] in FOR:
            rule["for"] = FOR[rule["alert"]]
            changed.add(rule["alert"])
    assert changed == set(FOR)
    (tmp / "rules.yml").write_text(yaml.safe_dump(rules))
    config = yaml.safe_load(SCRAPE.read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s",
                        "external_labels": {"gpuwarden_docs": WIKI}}
    [job] = config["scrape_configs"]
    job.update(scrape_interval="1s", static_configs=[{"targets": [f"127.0.0.1:{target}"]}])
    config["rule_files"] = [str(tmp / "rules.yml")]
    config["alerting"]["alertmanagers"][0]["static_configs"] = [{"targets": [f"127.0.0.1:{alertmanager}"]}]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    server = Server(tmp, "prometheus", [
        need("prometheus"), f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}"])
    wait_for(lambda: ready(port, server.proc, server.log), 60, interval=0.2, what="Prometheus to be ready")
    return server, port


def test_alerts_reach_a_webhook_through_prometheus_and_alertmanager(daemon_factory, fake_engine, receiver,
                                                                      tmp_path):
    engine = fake_engine("progress")
    d = daemon_factory(f'[[engine]]\nname = "fake"\nmetrics_url = "{engine.url}"\nscrape_interval = "0.5s"\n'
                       'min_stall = "2s"\non_stall = "alert"\n').start()
    d.wait_serving()
    servers = []
    try:
        am, am_port = start_alertmanager(tmp_path, f"http://127.0.0.1:{receiver.port}/hook")
        servers.append(am)
        prom, prom_port = start_prometheus(tmp_path, d.port, am_port)
        servers.append(prom)

        def firing(name: str, **labels):
            def find():
                for body in receiver.json_bodies("/hook"):
                    for alert in body["alerts"]:
                        if (alert["status"] == "firing" and alert["labels"]["alertname"] == name
                                and labels.items() <= alert["labels"].items()):
                            return alert
                return None
            return find

        def healthy() -> bool:
            query = http_get(f"http://127.0.0.1:{prom_port}/api/v1/query?query=up%7Bjob%3D%22gpuwarden%22%7D")
            return [r["value"][1] for r in json.loads(query)["data"]["result"]] == ["1"]

        wait_for(healthy, 30, interval=0.5, what="Prometheus to scrape gpuwarden")
        time.sleep(3)  # rules evaluated a few times on a healthy box: none of these may fire (a loop blocked
        # by the other work on a busy machine would be a true GpuwardenLoopBlocked)
        quiet = ("GpuwardenEngineStalled", "GpuwardenGpuLost", "GpuwardenDown", "GpuwardenIncident")
        assert not [name for name in quiet if firing(name)()], receiver.json_bodies("/hook")

        started = time.monotonic()
        engine.set_mode("stall")
        stalled = wait_for(firing("GpuwardenIncident", engine="fake", kind="engine_stall"), 45, interval=0.2,
                           what="GpuwardenIncident at the webhook")
        took_stall = time.monotonic() - started
        assert stalled["labels"]["severity"] == "critical" and stalled["labels"]["job"] == "gpuwarden"
        assert stalled["annotations"]["summary"].startswith("engine_stall on 127.0.0.1:")
        assert stalled["annotations"]["runbook_url"] == f"{WIKI}/fleet.md#gpuwardenincident"  # the base configured
        assert stalled["labels"]["id"] in {e["evidence"].get("incident") for e in d.events()}

        started = time.monotonic()
        with d.log_file.open("a") as log:
            log.write(LOST)
        lost = wait_for(firing("GpuwardenGpuLost", gpu=TEST_GPU), 45, interval=0.2,
                        what="GpuwardenGpuLost at the webhook")
        took_lost = time.monotonic() - started
        assert f"GPU {TEST_GPU} on 127.0.0.1:{d.port} is lost until a reboot" in lost["annotations"]["summary"]
        # one page per cause: the stall's own alert waited behind its incident, the lost GPU's incident behind it
        assert not firing("GpuwardenEngineStalled")() and not firing("GpuwardenIncident", kind="device_lost")()

        started = time.monotonic()
        d.proc.kill()
        d.proc.wait(10)
        down = wait_for(firing("GpuwardenDown"), 45, interval=0.2, what="GpuwardenDown at the webhook")
        took_down = time.monotonic() - started
        assert down["labels"]["instance"] == f"127.0.0.1:{d.port}" and down["labels"]["severity"] == "critical"
        print(f"to the webhook: stall {took_stall:.1f} s, lost GPU {took_lost:.1f} s, daemon killed {took_down:.1f} s"
              f" (scrape and evaluation 1 s, group_wait 1 s, GpuwardenDown for: {FOR['GpuwardenDown']})")
    finally:
        for server in reversed(servers):
            server.stop()
