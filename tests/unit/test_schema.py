"""config.py's tables through schema.py: what pydantic did for `check`, kept (every problem, named by key and
line, unknown keys after the others), and what it let through (nan, inf, a bool as a number) refused."""

import pytest

from gpuwarden.config.schema import Invalid
from gpuwarden.config.settings import AlertsConfig, Config, ConfigError, GpuConfig, KernelConfig, parse


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse(text, "gw.toml")
    return str(info.value)


@pytest.mark.parametrize(("text", "message"), [
    ("[gpu]\ninterval = nan\n", "gw.toml:2: gpu.interval: a duration is a finite number of seconds, not nan"),
    ("[gpu]\ninterval = inf\n", "gw.toml:2: gpu.interval: a duration is a finite number of seconds, not inf"),
    ("[gpu]\nbusy_ratio = nan\n", "gw.toml:2: gpu.busy_ratio: Input should be a finite number, not nan"),
    ("[gpu]\nedge_warn_celsius = -inf\n",
     "gw.toml:2: gpu.edge_warn_celsius: Input should be a finite number, not -inf"),
    ("[exporter]\nport = true\n", "gw.toml:2: exporter.port: Input should be a valid integer"),
    ("[gpu]\nbusy_ratio = false\n", "gw.toml:2: gpu.busy_ratio: Input should be a valid number"),
    ("[exporter]\nport = 1.5\n", "gw.toml:2: exporter.port: Input should be a valid integer, got a number with a "
                                 "fractional part"),
    ("[daemon]\nstate_dir = 5\n", "gw.toml:2: daemon.state_dir: Input is not a valid path"),
    ("daemon = 5\n", "gw.toml:1: daemon: Input should be a valid dictionary or instance of DaemonConfig"),
    ("[[engine]]\nname = 5\nurl = \"http://127.0.0.1:1\"\n", "gw.toml:2: engine[0].name: Input should be a valid "
                                                           "string"),
], ids=["duration-nan", "duration-inf", "number-nan", "number-inf", "bool-port", "bool-ratio", "fraction",
        "path", "table", "string"])
def test_a_value_of_the_wrong_kind_is_named_by_key_and_line(text, message):
    assert error_of(text) == message


def test_every_problem_is_said_in_the_files_order():
    """As an editor shows the file, top to bottom (they came in the schema's order: fields, then unknown keys)."""
    msg = error_of('[daemon]\nunknown1 = 1\nlog_level = "loud"\n[alerts]\ngive_up_after = "0.5s"\ncooldown = -1\n')
    assert msg.splitlines() == [
        "gw.toml:2: daemon.unknown1: unknown key: [daemon] takes state_dir, log_level, loop_lag_warn, status_interval, "
        "incidents_keep",
        "gw.toml:3: daemon.log_level: Input should be 'debug', 'info', 'warning' or 'error'",
        "gw.toml:5: alerts.give_up_after: must be at least 1s (0 or less would spin, flood or never finish)",
        "gw.toml:6: alerts.cooldown: a duration cannot be negative"]


def test_lax_values_pydantic_took_are_still_taken():
    c = parse('[exporter]\nport = "9000"\nenabled = true\n[daemon]\nincidents_keep = 5.0\n[gpu]\nbusy_ratio = "0.5"\n'
              'psu_guard_watts = 500\n')
    assert (c.exporter.port, c.exporter.enabled, c.daemon.incidents_keep) == (9000, True, 5)
    assert c.gpu.busy_ratio == 0.5 and c.gpu.psu_guard_watts == 500.0 and isinstance(c.gpu.psu_guard_watts, float)


def test_a_table_built_in_code_is_checked_as_a_parsed_one():
    with pytest.raises(Invalid, match="interval: must be at least 100ms"):
        GpuConfig(interval=0)
    assert KernelConfig(source="kmsg", storm_window=0).storm_window == 0.0
    assert AlertsConfig.validate({"retry_initial": 1}).retry_initial == 1.0


def test_tables_are_read_only_values_with_defaults_of_their_own():
    a, b = Config(), Config()
    assert a == b and a.kernel.rule is not b.kernel.rule  # equal, but no list shared between two of them
    with pytest.raises(AttributeError):
        a.gpu.interval = 0.0
    assert parse("[kernel]\nstorm_window = 2\n").kernel.fields_set == {"storm_window"}


def test_the_dump_masks_secrets_and_credentials():
    c = parse('[alerts]\nurls = ["ntfys://tok3n@ntfy.example.org/box"]\n[[engine]]\nname = "e"\n'
              'url = "http://user:s3cret@127.0.0.1:8000"\n')
    dumped = str(c.dump())
    assert "tok3n" not in dumped and "s3cret" not in dumped and "**********" in dumped
    assert c.alerts.urls[0].get_secret_value() == "ntfys://tok3n@ntfy.example.org/box"
    assert "tok3n" not in repr(c.alerts)
