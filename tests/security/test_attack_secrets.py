"""Findings 6 and 7 of issue 13: credentials in a metrics_url or an alert URL never reach check's output, the
log (at any log_level), events or incident reports; a metrics_url is http(s) with a host, its default port
the scheme's."""

import subprocess
import time

import pytest
from helpers import GPUWARDEN, Receiver, wait_for

from gpuwarden.config.settings import EngineConfig
from gpuwarden.engine.parts import target_spec
from gpuwarden.runtime.logsetup import redact

SECRETS = ("hunter2", "s3cret-api-key", "alert-path-token")


def secret_url(engine) -> str:
    return engine.url.replace("http://", "http://admin:hunter2@") + "?api_key=s3cret-api-key"


def engine_config(url: str, **settings) -> str:
    opts = {"scrape_interval": '"0.5s"', "min_stall": '"2s"', "on_stall": '"alert"', **settings}
    return f'[[engine]]\nname = "e"\nmetrics_url = "{url}"\n' + "".join(f"{k} = {v}\n" for k, v in opts.items())


def test_check_masks_credentials_in_metrics_url(tmp_path):
    config = tmp_path / "gpuwarden.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n'
                      + engine_config("http://admin:hunter2@127.0.0.1:1/metrics?api_key=s3cret-api-key"))
    out = subprocess.run([*GPUWARDEN, "--config", str(config), "check", "--show"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert '"metrics_url": "http://***@127.0.0.1:1/metrics?api_key=***"' in out.stdout
    assert not any(s in out.stdout + out.stderr for s in SECRETS)


@pytest.mark.root
@pytest.mark.parametrize("level", ["info", "debug"])
def test_no_secret_in_the_log_events_or_incidents(attacker, daemon_factory, level):
    """A scrape every 0.5 s with credentials in the URL, a stall that alerts through a URL with a token in its
    path; before, httpx logged every request (with the query's key) at info, apprise and urllib3 the alert
    URL at debug."""
    receiver = Receiver().start()
    try:
        engine = attacker.start_engine()
        d = daemon_factory(f'[alerts]\nurls = ["json://127.0.0.1:{receiver.port}/alert-path-token"]\n'
                           + engine_config(secret_url(engine)))
        text = d.config_path.read_text().replace("[daemon]\n", f'[daemon]\nlog_level = "{level}"\n', 1)
        d.config_path.write_text(text)
        d.start()
        d.wait_serving()
        time.sleep(2)
        engine.set_mode("stall")
        wait_for(lambda: receiver.received, 30, what="the stall alert")
        wait_for(lambda: any((p / "incident.json").exists() for p in (d.state / "incidents").glob("*")), 30,
                 what="the incident report")
        engine.set_mode("hang")  # now scrapes fail: errors go into events too
        wait_for(lambda: any(e["kind"] == "engine_unresponsive" for e in d.events()), 30,
                 what="engine_unresponsive")
        assert d.stop() == 0
        log = d.log()
        assert "HTTP Request:" not in log
        stored = "".join(p.read_text(errors="replace") for p in (d.state / "incidents").rglob("*.json"))
        events = subprocess.run([*GPUWARDEN, "--config", str(d.config_path), "events", "--jsonl", "--since", "1d"],
                                capture_output=True, text=True, timeout=60).stdout
        for secret in SECRETS:
            assert secret not in log and secret not in stored and secret not in events, secret
        if level == "debug":
            assert "DEBUG" in log  # the level took effect: this is a debug log without the secrets
    finally:
        receiver.stop()


@pytest.mark.parametrize("url", ["127.0.0.1:8000/metrics", "ftp://127.0.0.1/metrics", "http:///metrics",
                                 "http://admin:hunter2@127.0.0.1:99999/metrics"])
def test_check_refuses_a_metrics_url_that_is_not_http_with_a_host(tmp_path, url):
    config = tmp_path / "gpuwarden.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n' + engine_config(url))
    out = subprocess.run([*GPUWARDEN, "--config", str(config), "check"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 78, out.stdout
    assert f"{config}:5: engine[0].metrics_url:" in out.stderr and "hunter2" not in out.stderr


def test_the_kill_target_port_comes_from_the_scheme():
    def port(url):
        return target_spec(EngineConfig(name="e", metrics_url=url)).port
    assert port("https://127.0.0.1/metrics") == 443
    assert port("http://127.0.0.1/metrics") == 80
    assert port("https://127.0.0.1:8443/metrics") == 8443
    assert target_spec(EngineConfig(name="e", metrics_url="http://[::1]:8000/m")).host == "::1"


def test_redact_masks_userinfo_and_query_values_of_every_url():
    text = ('GET http://admin:hunter2@127.0.0.1:8000/metrics?api_key=s3cret&x=1 "HTTP/1.1 200 OK"; '
            "alert ntfy://tok@ntfy.sh/topic; https://host/path#frag stays")
    assert redact(text) == ('GET http://***@127.0.0.1:8000/metrics?api_key=***&x=*** "HTTP/1.1 200 OK"; '
                            "alert ntfy://***@ntfy.sh/topic; https://host/path#frag stays")
