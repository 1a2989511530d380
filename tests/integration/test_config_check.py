"""`gpuwarden check` refuses every value that breaks `run` (issue 14), naming key and line; a reload refuses
them too; options go before or after the subcommand."""

import signal
import subprocess

import pytest
from helpers import GPUWARDEN

ENGINE = '[[engine]]\nname = "e"\nmetrics_url = "http://127.0.0.1:1/metrics"\n'


@pytest.mark.parametrize(("config", "names"), [
    (ENGINE + "scrape_interval = 0\n", ":4: engine[0].scrape_interval: must be at least 100ms"),
    (ENGINE + 'scrape_timeout = "0s"\n', ":4: engine[0].scrape_timeout: must be at least 100ms"),
    (ENGINE + 'min_stall = "1h"\nmax_stall = "10m"\n', ":1: engine[0]: min_stall (3600s) is above max_stall (600s)"),
    (ENGINE + "max_body_bytes = 0\n", ":4: engine[0].max_body_bytes: Input should be greater than or equal to 1024"),
    ("[daemon]\nstatus_interval = 0\n", ":2: daemon.status_interval: must be at least 1s"),
    ("[daemon]\nloop_lag_warn = 0\n", ":2: daemon.loop_lag_warn: must be at least 100ms"),
    ("[gpu]\ninterval = 0\n", ":2: gpu.interval: must be at least 100ms"),
    ("[gpu]\nread_deadline = 0\n", ":2: gpu.read_deadline: must be at least 100ms"),
    ("[alerts]\nretry_initial = 0\n", ":2: alerts.retry_initial: must be at least 100ms"),
    ('[alerts]\nretry_initial = "1m"\nretry_max = "10s"\n', ":1: alerts: retry_max (10s) is below retry_initial (60s)"),
    ("[alerts]\nsend_timeout = 0\n", ":2: alerts.send_timeout: must be at least 1s"),
    ("[engines]\ndiscover_interval = 0\n", ":2: engines.discover_interval: must be at least 1s"),
    ("[guard]\nverify_interval = 0\n", ":2: guard.verify_interval: must be at least 100ms"),
    ('[exporter]\nlisten = "nohost.invalid"\n', ":2: exporter.listen: 'nohost.invalid' is not an address to listen on"),
    ('[exporter]\nlisten = "127.0.0.1:9000"\nport = 9001\n',
     ":1: exporter: listen '127.0.0.1:9000' names port 9000 but port = 9001: say it once"),
    ('[kernel]\nstorm_window = "2s"\ndisable_rules = ["amd_vram_lost", "amd_ras_corectable"]\n',
     ":3: kernel.disable_rules[1]: unknown built-in rule 'amd_ras_corectable' (did you mean 'amd_ras_correctable'?)"),
    ('[kernel.rule_severity]\namd_vram_lost = "critical"\nnv_fallen_of_bus = "warning"\n',
     ":3: kernel.rule_severity.nv_fallen_of_bus: unknown built-in rule 'nv_fallen_of_bus' (did you mean "
     "'nv_fallen_off_bus'?)"),
    (ENGINE + 'source = "log"\nlog_unit = "vllm.service"\nlog_container = "vllm"\n',
     ':1: engine[0]: source "log" needs exactly one of log_file, log_unit and log_container (not log_unit and '
     'log_container)'),
    (ENGINE + 'source = "log"\nlog_container = "../images/create"\n',
     ":5: engine[0].log_container: '../images/create' is not a Docker container name or id"),
    (ENGINE + '[engine.target]\nkind = "docker"\ncontainer = "vllm/../../x"\n',
     ":6: engine[0].target.container: 'vllm/../../x' is not a Docker container name or id"),
    (ENGINE + '[engine.target]\nkind = "docker"\ncontainer = "vllm"\ndocker_socket = "docker.sock"\n',
     ":7: engine[0].target.docker_socket: 'docker.sock' is not an absolute path"),
    ('[kernel]\nstorm_window = "2s"\nsource = "file"\n',
     ':1: kernel: source = "file" needs file, the log file to follow'),
    ('[exporter]\nenabled = true\nlisten = "127.0.0.1:99999"\n',
     ":3: exporter.listen: '127.0.0.1:99999': port 99999 is above 65535"),
    ('[alerts]\ncooldown = "10m"\nurls = ["ntfys://ntfy.example.org/box", "notaservice://x"]\n',
     ":3: alerts.urls[1]: apprise has no service for notaservice://; its services and their URLs: "
     "https://appriseit.com/services/"),
    ('[alerts]\n\n[[alerts.target]]\nurl = "ntfys://ntfy.example.org/box"\n\n[[alerts.target]]\nname = "pager"\n'
     'url = "tgram://bottoken/chatid"\n', ":8: alerts.target[1].url: apprise's Telegram service (tgram://) does "
     "not accept this URL: a part is missing or malformed (its form: https://appriseit.com/services/telegram/)"),
    (ENGINE + '[engine.target]\nkind = "cmdline"\npattern = "vllm serve (Qwen"\n',
     ":6: engine[0].target.pattern: not a regular expression: missing ), unterminated subpattern"),
    ('[[kernel.rule]]\npattern = "my_driver: fatal"\nkind = "gpu_reset"\nrunbook = "devce_lost"\n',
     ":4: kernel.rule[0].runbook: unknown runbook 'devce_lost' (did you mean 'device_lost'?)"),
    ('[engines]\nmax_discovered = 0\n', ":2: engines.max_discovered: Input should be greater than or equal to 1"),
    ('[daemon]\nlog_level = "info"\nincidents_keep = 0\n',
     ":3: daemon.incidents_keep: Input should be greater than or equal to 1"),
], ids=["scrape_interval", "scrape_timeout", "min_stall-above-max_stall", "max_body_bytes", "status_interval",
        "loop_lag_warn", "gpu.interval", "read_deadline", "retry_initial", "retry_max-below-retry_initial",
        "send_timeout", "discover_interval", "verify_interval", "listen-unresolvable", "listen-two-ports",
        "disable_rules-unknown", "rule_severity-unknown", "two-log-sources", "log_container-name",
        "target-container-name", "docker_socket-relative", "kernel-file-without-file", "listen-port-too-big",
        "alert-url", "alert-target-url", "target-pattern-not-a-regex", "rule-runbook-unknown",
        "max_discovered", "incidents_keep"])
def test_check_refuses_a_value_that_breaks_run_naming_key_and_line(tmp_path, config, names):
    path = tmp_path / "bad.toml"
    path.write_text(config)
    result = subprocess.run([*GPUWARDEN, "check", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 78, result.stdout + result.stderr
    assert f"{path}{names}" in result.stderr


def test_listen_takes_host_and_port(tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text('[exporter]\nlisten = "127.0.0.1:9000"\n')
    result = subprocess.run([*GPUWARDEN, "check", "--config", str(path), "--show"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert '"listen": "127.0.0.1"' in result.stdout and '"port": 9000' in result.stdout


def test_an_apprise_config_file_without_a_usable_url_is_refused_by_check(tmp_path):
    apprise_file = tmp_path / "apprise.yml"
    apprise_file.write_text("urls:\n  - notaservice://nothing\n")
    path = tmp_path / "gw.toml"
    path.write_text(f'[alerts]\nconfig_file = "{apprise_file}"\n')
    result = subprocess.run([*GPUWARDEN, "check", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 78 and "alerts.config_file" in result.stderr and "no usable URL" in result.stderr


@pytest.mark.parametrize("argv", [
    ["--config", "{cfg}", "check"], ["check", "--config", "{cfg}"], ["check", "{cfg}"],
    ["events", "--since", "1h", "--config", "{cfg}", "--json"], ["incidents", "--config", "{cfg}"],
    ["doctor", "--json", "--config", "{cfg}"], ["quarantine", "--dry-run", "--config", "{cfg}"],
    ["status", "--config", "{cfg}"], ["guard", "status", "--config", "{cfg}"], ["test-alert", "--config", "{cfg}"],
    ["replay", "-", "--config", "{cfg}"], ["run", "--config", "{cfg}"],
], ids=lambda argv: " ".join(argv))
def test_config_goes_before_or_after_the_subcommand(tmp_path, argv):
    cfg = tmp_path / "gw.toml"  # a key no gpuwarden knows: the command read this file when it names it
    cfg.write_text("[daemon]\nbogus = 1\n")
    result = subprocess.run([*GPUWARDEN, *(a.format(cfg=cfg) for a in argv)], capture_output=True, text=True,
                            input="", timeout=120)
    assert result.returncode == 78, result.stderr
    assert f"{cfg}:2: daemon.bogus: unknown key" in result.stderr


def test_check_with_two_different_files_is_a_usage_error(tmp_path):
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text("")
    b.write_text("")
    result = subprocess.run([*GPUWARDEN, "check", str(a), "--config", str(b)], capture_output=True, text=True)
    assert result.returncode == 2 and "two files given" in result.stderr


def test_a_reload_refuses_a_value_that_breaks_run(daemon_factory, notify_socket):
    d = daemon_factory(env={"NOTIFY_SOCKET": notify_socket.path}).start()
    ready = notify_socket.wait("READY=1", timeout=20)
    d.wait_serving()
    d.config_path.write_text(d.config_path.read_text().replace('status_interval = "1s"', "status_interval = 0"))
    d.proc.send_signal(signal.SIGHUP)
    reloading = notify_socket.wait("RELOADING=1", after=ready + 1)
    failed = notify_socket.wait("STATUS=reload failed, old configuration kept", after=reloading + 1)
    notify_socket.wait("READY=1", after=failed)
    d.wait_log("daemon.status_interval: must be at least 1s")
    assert d.proc.poll() is None
    assert d.stop() == 0
