import json
import os
import re
import sys

import pytest

from gpuwarden.config import settings as config
from gpuwarden.config.settings import ConfigError, parse, parse_duration
from gpuwarden.core.model import Severity


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse(text, "gw.toml")
    return str(info.value)


def test_empty_file_gives_the_defaults():
    c = parse("")
    assert c.kernel.source == "auto"
    assert c.kernel.storm_window == 2.0
    assert c.exporter.listen == "127.0.0.1"
    assert c.exporter.port == config.DEFAULT_EXPORTER_PORT


@pytest.mark.parametrize(("text", "seconds"), [
    (90, 90.0), (1.5, 1.5), ("90s", 90.0), ("5m", 300.0), ("1h30m", 5400.0), ("250ms", 0.25), ("2d", 172800.0),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["abc", "5 minutes", "", "-3s", True, "5m3"])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_unknown_key_names_key_line_and_suggestion():
    msg = error_of("[daemon]\nlog_level = \"info\"\n\n[kernel]\nstorm_windw = \"3s\"\n")
    assert msg == "gw.toml:5: kernel.storm_windw: unknown key (did you mean 'storm_window'?)"


def test_unknown_table_is_an_error():
    assert "gw.toml:1: kernal: unknown key (did you mean 'kernel'?)" in error_of("[kernal]\n")


def test_type_error_names_key_and_line():
    msg = error_of("[exporter]\nenabled = true\nport = \"ninety\"\n")
    assert msg.startswith("gw.toml:3: exporter.port: ")
    assert "integer" in msg


def test_bad_duration_names_key_and_line():
    msg = error_of("[kernel]\n\nlookback = \"10 mins\"\n")
    assert msg.startswith("gw.toml:3: kernel.lookback: bad duration '10 mins'")


def test_an_alertmanager_resend_at_its_resolve_timeout_is_refused():
    """At or above Alertmanager's default resolve_timeout an open incident would resolve there between sends."""
    msg = error_of("[alerts]\nhostname = \"x\"\nalertmanager_resend = \"5m\"\n")
    assert msg.startswith("gw.toml:3: alerts.alertmanager_resend: 300s is not below Alertmanager's default "
                          "resolve_timeout (5m)"), msg
    assert parse("[alerts]\nalertmanager_resend = \"4m\"\n").alerts.alertmanager_resend == 240.0


def test_errors_inside_arrays_of_tables_point_at_the_right_entry():
    msg = error_of('[[kernel.rule]]\npattern = "mydrv: gave up for good"\nkind = "xid"\n\n'
                   '[[kernel.rule]]\npattern = "("\nkind = "sq_int"\n')
    lines = msg.splitlines()
    assert lines[0].startswith("gw.toml:6: kernel.rule[1].pattern: not a regular expression")
    assert lines[1] == "gw.toml:7: kernel.rule[1].kind: unknown event kind 'sq_int' (did you mean 'sq_intr'?)"


def test_a_repeated_engine_name_names_it_and_a_line():
    engine = '[[engine]]\nname = "e"\nmetrics_url = "http://127.0.0.1:8000/metrics"\n'
    assert error_of("[daemon]\n" + engine + engine) == "gw.toml:2: engine: engine name 'e' is used twice"


def test_missing_required_key_points_at_its_table():
    assert error_of('[kernel]\n[[kernel.rule]]\nkind = "xid"\n') == \
        "gw.toml:2: kernel.rule[0].pattern: required key is missing"


def test_inline_table_errors_point_at_the_key():
    msg = error_of('[kernel]\nxid = { "13" = "critical", "x" = "info" }\n')
    assert msg.startswith("gw.toml:2: kernel.xid: ")


def test_severity_overrides_check_the_kind():
    assert "did you mean 'page_fault'" in error_of('[kernel.severity]\npage_falt = "critical"\n')


def test_toml_syntax_error_is_a_config_error_at_its_line():
    assert error_of("[kernel\n").startswith("gw.toml:1: not valid TOML")
    assert error_of("[daemon]\nstate_dir = \n").startswith("gw.toml:2: not valid TOML: Invalid value")


def test_missing_explicit_file_and_unreadable_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        config.load(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match="cannot read"):
        config.load(tmp_path)  # a directory: unreadable as a file


def test_no_file_at_the_default_path_means_defaults(monkeypatch, tmp_path):
    monkeypatch.setattr(config, "DEFAULT_PATH", tmp_path / "gpuwarden.toml")
    cfg, path = config.load(None)
    assert path is None
    assert cfg == config.Config()


def test_example_config_is_complete_and_valid():
    """config/gpuwarden.toml shows every option: each key of every table of the schema appears in it."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "config" / "gpuwarden.toml").read_text()
    parse(text)

    def check(model, path):
        for key, field in model.fields.items():
            inner = field.table
            name = ".".join([*path, key])
            if inner:
                assert f"[{name}]" in text or f"[[{name}]]" in text, name
                check(inner, [*path, key])
            else:
                assert f"{key} =" in text or f"[{name}]" in text, name

    check(config.Config, [])


def test_an_engine_without_metrics_is_named_by_its_api_url():
    c = parse('[[engine]]\nname = "llama"\nurl = "http://127.0.0.1:8080/"\nsource = "slots"\n')
    assert c.engine[0].metrics_url == "http://127.0.0.1:8080/metrics"
    from gpuwarden.engine.parts import base_url
    assert base_url(c.engine[0]) == "http://127.0.0.1:8080"
    both = parse('[[engine]]\nname = "v"\nurl = "http://127.0.0.1:8000"\nmetrics_url = "http://127.0.0.1:9/m"\n')
    assert both.engine[0].metrics_url == "http://127.0.0.1:9/m" and base_url(both.engine[0]) == "http://127.0.0.1:8000"


@pytest.mark.parametrize(("text", "message"), [
    ('[[engine]]\nname = "e"\n', "gw.toml:1: engine[0]: an engine needs metrics_url, or url (its API)"),
    ('[[engine]]\nname = "e"\nurl = "ftp://x"\n', "gw.toml:3: engine[0].url: 'ftp://x' is not an http:// or https://"),
])
def test_an_engine_needs_a_url_it_can_reach(text, message):
    assert message in error_of(text)


def test_built_in_rules_are_disabled_and_overridden_by_name():
    c = parse('[kernel]\ndisable_rules = ["amd_ras_correctable"]\n[kernel.rule_severity]\namd_vram_lost = "critical"\n')
    assert c.kernel.disable_rules == ["amd_ras_correctable"]
    assert c.kernel.rule_severities() == {"amd_vram_lost": Severity.CRITICAL}


@pytest.mark.parametrize(("text", "message"), [
    ('[kernel]\ndisable_rules = ["amd_vram_lsot"]\n',
     "gw.toml:2: kernel.disable_rules[0]: unknown built-in rule 'amd_vram_lsot' (did you mean 'amd_vram_lost'?)"),
    ('[kernel.rule_severity]\n\nmy_rule = "info"\n', "gw.toml:3: kernel.rule_severity.my_rule: unknown built-in rule "
     "'my_rule'"),
    ('[kernel.rule_severity]\nnv_xid = "info"\n',
     "gw.toml:1: kernel.rule_severity: nv_xid: an Xid line's severity is its Xid's: set it in [kernel.xid]"),
    ('[kernel.rule_severity]\naer_no_callback = "info"\n', "gw.toml:1: kernel.rule_severity: aer_no_callback makes "
     "no event of its own (it only feeds a correlation): nothing to set"),
    ('[kernel]\ndisable_rules = ["amd_vram_lost"]\n[kernel.rule_severity]\namd_vram_lost = "info"\n',
     "gw.toml:1: kernel: rule 'amd_vram_lost' is in disable_rules and in [kernel.rule_severity]: say which"),
    ('[kernel.rule_severity]\namd_vram_lost = "fatal"\n', "gw.toml:2: kernel.rule_severity.amd_vram_lost: Input "
     "should be 'info', 'warning' or 'critical'"),
], ids=["unknown-disabled", "unknown-overridden", "xid", "quiet", "both", "bad-severity"])
def test_rule_names_are_checked_with_key_and_line(text, message):
    assert error_of(text) == message


def test_the_readmes_toml_examples_pass_check():
    """A new user copies these (the README's and the docs'): each parses, and apprise takes its alert URLs (as
    `check` and `run` build them)."""
    import re

    from gpuwarden.alert.targets import build
    from paths import ROOT

    found = 0
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"^```toml\n(.*?)^```", path.read_text(), re.S | re.M):
            build(parse(block, path.name).alerts)
            found += 1
    assert found >= 5


def test_the_example_configs_commented_alert_urls_are_accepted():
    """Uncommenting an example URL of config/gpuwarden.toml gives a target apprise takes."""
    import re

    from gpuwarden.alert.targets import build
    from paths import ROOT

    text = (ROOT / "config" / "gpuwarden.toml").read_text()
    alerts = text[text.index("\n[alerts]"):text.index("\n[engines]")]
    lines = re.findall(r"^# (urls = \[.*\]|url = \".*?\")", alerts, re.M)
    assert len(lines) == 2
    for line in lines:
        build(parse("[alerts]\n" + (line if line.startswith("urls") else f"[[alerts.target]]\n{line}")).alerts)


@pytest.mark.parametrize(("text", "where"), [
    ('[daemon]\nstate_dir = "~/gpuwarden"\n', "gw.toml:2: daemon.state_dir"),
    ('[kernel]\nsource = "file"\nfile = "kern.log"\n', "gw.toml:3: kernel.file"),
    ('[alerts]\nconfig_file = "apprise.yml"\n', "gw.toml:2: alerts.config_file"),
    ('[gpu]\nsysfs_root = "sys"\n', "gw.toml:2: gpu.sysfs_root"),
    ('[cache]\ndirs = ["/root/.cache/vllm", ".triton/cache"]\n', "gw.toml:2: cache.dirs[1]"),
    ('[[engine]]\nname = "e"\nurl = "http://127.0.0.1:8080"\nsource = "log"\nlog_file = "llama.log"\n',
     "gw.toml:5: engine[0].log_file"),
    ('[[engine]]\nname = "e"\nurl = "http://127.0.0.1:8080"\n[engine.target]\nkind = "pidfile"\n'
     'pidfile = "run/e.pid"\n',
     "gw.toml:6: engine[0].target.pidfile"),
    ('[[engine]]\nname = "e"\nurl = "http://127.0.0.1:8080"\n[engine.target]\nkind = "cgroup"\n'
     'cgroup = "system.slice"\n',
     "gw.toml:6: engine[0].target.cgroup"),
], ids=["state_dir", "kernel.file", "config_file", "sysfs_root", "cache.dirs", "log_file", "pidfile", "cgroup"])
def test_paths_must_be_absolute(text, where):
    """The daemon runs in / under systemd, `check` and `events` wherever the user is: a relative path (or a `~`,
    which nothing expands) would name another file for each of them."""
    assert error_of(text).startswith(f"{where}: '")
    assert error_of(text).endswith("is not an absolute path")


def test_restart_needs_a_supervisor_and_the_canary():
    engine = '[[engine]]\nname = "e"\nmetrics_url = "http://127.0.0.1:8000/metrics"\n'
    assert 'on_stall = "restart" needs an engine that systemd or Docker supervises' in error_of(
        engine + 'on_stall = "restart"\n')
    assert "docs/restart.md" in error_of(engine + 'on_gpu_fault = "restart"\n[engine.target]\nkind = "cmdline"\n'
                                         'pattern = "vllm"\n')
    assert 'needs the canary' in error_of(engine + 'on_unresponsive = "restart"\ncanary = "off"\n'
                                          '[engine.target]\nkind = "unit"\nunit = "vllm.service"\n')
    unit = parse(engine + 'on_stall = "restart"\nrestart_timeout = "15m"\n[engine.target]\nkind = "unit"\n'
                          'unit = "vllm.service"\n').engine[0]
    assert unit.on_stall == "restart" and unit.restart_timeout == 900.0
    docker = parse(engine + 'on_stall = "restart"\n[engine.target]\nkind = "docker"\ncontainer = "vllm"\n')
    assert docker.engine[0].restart_timeout == 600.0


@pytest.mark.parametrize("text, key", [
    ('[kernel]\nsource = "journal"\n', "kernel"),
    ('[[engine]]\nname = "a"\nurl = "http://127.0.0.1:8000"\nsource = "log"\nlog_unit = "a.service"\n', "engine")])
def test_reading_the_journal_without_systemd_python_is_refused(monkeypatch, text, key):
    """systemd-python is the optional extra `journal`: made unimportable here (it is installed with [test])."""
    parse(text)  # with it: accepted
    monkeypatch.setitem(sys.modules, "systemd", None)
    with pytest.raises(ConfigError, match=r"systemd-python.*gpuwarden\[journal\]") as info:
        parse(text)
    assert key in str(info.value)


def test_the_canarys_key_file_must_be_gpuwardens_own_and_no_one_elses_and_is_never_shown(tmp_path):
    key = tmp_path / "vllm.key"
    key.write_text("s3cret-key\n")
    engine = f'[[engine]]\nname = "v"\nmetrics_url = "http://127.0.0.1:8000/metrics"\ncanary_api_key_file = "{key}"\n'
    for mode, why in ((0o644, "open to others (mode 644)"), (0o640, "open to others (mode 640)")):
        key.chmod(mode)
        with pytest.raises(ConfigError, match=re.escape(why)) as refused:
            parse(engine)
        assert "s3cret" not in str(refused.value)
    key.chmod(0o600)
    config = parse(engine)
    assert config.engine[0].canary_api_key_file == key and "s3cret" not in json.dumps(config.dump())
    os.chown(key, 65534, 65534)  # nobody's: not gpuwarden's own
    with pytest.raises(ConfigError, match="belongs to uid 65534"):
        parse(engine)
    for bad, why in ((tmp_path, "is not a regular file"), (tmp_path / "none", "No such file")):
        with pytest.raises(ConfigError, match=why):
            parse(engine.replace(str(key), str(bad)))
    two = tmp_path / "two.key"
    two.write_text("a\nb\n")
    two.chmod(0o600)
    with pytest.raises(ConfigError, match="does not hold one API key"):
        parse(engine.replace(str(key), str(two)))


@pytest.mark.parametrize(("setting", "why"), [
    ('canary_headers = { Authorization = "Bearer k" }', "carries a credential: put the key in canary_api_key_file"),
    ('canary_headers = { "X-Api-Key" = "k" }', "carries a credential"),
    ('canary_headers = { "a b" = "k" }', "is not an HTTP header name"),
    ('canary_route = "v1/completions"', "is not a path such as"),
])
def test_canary_settings_that_would_leak_a_key_or_ask_nowhere_are_refused(setting, why):
    with pytest.raises(ConfigError, match=re.escape(why)):
        parse(f'[[engine]]\nname = "v"\nmetrics_url = "http://127.0.0.1:8000/metrics"\n{setting}\n')
