import random
from itertools import combinations

import pytest

from gpuwarden.config.settings import GpuConfig
from gpuwarden.core.model import GpuSample, Severity
from gpuwarden.gpu.rules import TelemetryRules


def s(gpu="0000:03:00.0", model="Radeon RX 7900 XTX", **kw):
    base = {"temperatures": {"edge": 50.0, "junction": 60.0}, "power_watts": 250.0, "power_cap_watts": 327.0,
            "fan_rpm": 1400.0, "busy_ratio": 0.95, "sclk_hz": 2.4e9, "sclk_max_hz": 2.9e9, "pcie_speed_gts": 16.0,
            "pcie_width": 16, "pcie_max_speed_gts": 16.0, "pcie_max_width": 16}
    base.update(kw)
    return GpuSample(gpu=gpu, vendor="amd", model=model, time=0.0, **base)


def run(rules, *samples, now=0.0):
    return rules.evaluate({x.gpu: x for x in samples}, now)


def test_normal_gpus_raise_nothing():
    assert run(TelemetryRules(GpuConfig()), s(), s("0000:83:00.0")) == []


def test_junction_warning_then_critical_then_resolved():
    rules = TelemetryRules(GpuConfig())
    [warn] = run(rules, s(temperatures={"junction": 101.0}))
    assert (warn.event.kind, warn.event.severity) == ("thermal", Severity.WARNING)
    assert run(rules, s(temperatures={"junction": 102.0})) == []  # still the same condition
    [crit] = run(rules, s(temperatures={"junction": 111.0}))
    assert crit.event.severity == Severity.CRITICAL
    [ended] = run(rules, s(temperatures={"junction": 80.0}))
    assert ended.event is None and ended.dedupe_key == "thermal:0000:03:00.0:junction" == warn.event.dedupe_key


def test_a_condition_taken_up_from_a_past_run_is_told_when_it_ends_and_not_again_while_it_lasts():
    key = "thermal:0000:03:00.0:junction"
    rules = TelemetryRules(GpuConfig())
    rules.resume([key])
    assert run(rules, s(temperatures={"junction": 101.0})) == []  # still hot: it was told, nothing new
    [ended] = run(rules, s(temperatures={"junction": 80.0}))
    assert ended.event is None and ended.key == key and ended.message == f"thermal back to normal: {key}"
    rules = TelemetryRules(GpuConfig())
    rules.resume([key])  # taken up as a warning: worse than that is news
    [crit] = run(rules, s(temperatures={"junction": 111.0}))
    assert crit.event.severity == Severity.CRITICAL


def test_a_reload_keeps_what_is_open_and_judges_it_by_the_new_thresholds():
    rules = TelemetryRules(GpuConfig())
    [warn] = run(rules, s(temperatures={"junction": 101.0}))
    rules.configure(GpuConfig(junction_warn_celsius=105.0, junction_critical_celsius=115.0))
    [ended] = run(rules, s(temperatures={"junction": 101.0}))  # no longer hot by the new thresholds: told
    assert ended.event is None and ended.key == warn.key


def test_power_over_cap_and_spike_and_psu_guard():
    rules = TelemetryRules(GpuConfig(psu_guard_watts=500))
    run(rules, s(power_watts=100.0), s("0000:83:00.0", power_watts=100.0))
    changes = run(rules, s(power_watts=360.0), s("0000:83:00.0", power_watts=330.0))
    messages = sorted(c.event.message for c in changes)
    assert any("above its cap 327 W on 0000:03:00.0" in m for m in messages)
    assert any("power jumped 100 -> 360 W" in m for m in messages)
    assert any("all GPUs together draw 690 W" in m for m in messages)


def test_a_spike_that_ends_resolves_only_itself():
    """Two conditions of one GPU are two alerts: the spike's end must not send [RESOLVED] for the over-cap."""
    rules = TelemetryRules(GpuConfig())
    run(rules, s(power_watts=100.0))
    raised = {c.event.dedupe_key for c in run(rules, s(power_watts=360.0))}
    assert raised == {"power:0000:03:00.0:cap", "power:0000:03:00.0:spike"}
    [ended] = run(rules, s(power_watts=361.0))  # still over the cap, no new jump
    assert ended.event is None and ended.dedupe_key == "power:0000:03:00.0:spike"


def test_fan_stopped_while_hot_but_passive_cards_are_fine():
    rules = TelemetryRules(GpuConfig())
    [fan] = run(rules, s(fan_rpm=0.0, temperatures={"junction": 85.0}))
    assert (fan.event.kind, fan.event.severity) == ("fan", Severity.CRITICAL)
    assert run(TelemetryRules(GpuConfig()), s(fan_rpm=None, fan_state="passive", temperatures={"gpu": 80.0})) == []


def test_clock_stuck_low_under_load_and_throttling():
    rules = TelemetryRules(GpuConfig())
    [low] = run(rules, s(sclk_hz=0.8e9))
    assert low.event.kind == "clock" and "800 MHz under load" in low.event.message
    assert run(TelemetryRules(GpuConfig()), s(sclk_hz=0.8e9, busy_ratio=0.1)) == []  # idle: low clocks are normal
    [throttle] = run(TelemetryRules(GpuConfig()), s(throttle=("hw_thermal",)))
    assert "throttling: hw_thermal" in throttle.event.message


def test_pcie_link_below_max_counts_only_under_load():
    assert run(TelemetryRules(GpuConfig()), s(pcie_speed_gts=2.5, busy_ratio=0.0)) == []
    [link] = run(TelemetryRules(GpuConfig()), s(pcie_speed_gts=5.0, pcie_width=8))
    assert link.event.kind == "pcie_link" and "5.0 GT/s x8 under load" in link.event.message


def test_asymmetry_between_same_model_gpus():
    rules = TelemetryRules(GpuConfig())
    [asym] = run(rules, s(power_cap_watts=327.0), s("0000:83:00.0", power_cap_watts=300.0,
                                                    overdrive={"OD_SCLK_OFFSET": {"": -150.0}}))
    assert asym.event.kind == "config_asymmetry" and asym.event.severity == Severity.WARNING
    assert "power caps 327 W vs 300 W" in asym.event.message and "overdrive settings differ" in asym.event.message
    # different models are not compared; similar clocks under load are fine
    assert run(TelemetryRules(GpuConfig()), s(), s("0000:83:00.0", model="other", power_cap_watts=300.0)) == []
    [clocks] = run(TelemetryRules(GpuConfig()), s(), s("0000:83:00.0", sclk_hz=1.8e9))
    assert "clocks under load 2400 vs 1800 MHz" in clocks.event.message



def _every_pair(samples, rules):
    """The asymmetries as _host found them before it judged a model's GPUs by their extremes: every pair of the
    same model compared (the reference the shortcut must equal, event for event, in the same order)."""
    return [(f"config_asymmetry:{a.gpu}:{b.gpu}", differences)
            for a, b in combinations(sorted(samples, key=lambda x: x.gpu), 2)
            if a.model and a.model == b.model and (differences := rules.differences(a, b))]


@pytest.mark.parametrize("seed", range(300))
def test_asymmetries_judged_by_a_models_extremes_are_those_of_every_pair(seed):
    """Many GPUs, a few models, caps and clocks near the thresholds, some idle, some without a figure: the
    extremes shortcut finds the same pairs, with the same differences, in the same order, as comparing every
    pair did (a group is compared pair by pair only when its extremes differ)."""
    rng, c = random.Random(seed), GpuConfig()
    samples = []
    for i in range(rng.randint(1, 12)):
        samples.append(s(f"0000:{rng.randrange(256):02x}:{i:02x}.0", model=rng.choice(["A", "B", "C", None]),
                         power_cap_watts=rng.choice([None, 0.0, 300.0, 300.0 + c.asymmetry_power_cap_watts,
                                                     300.0 + c.asymmetry_power_cap_watts + 0.05, 340.0]),
                         overdrive=rng.choice([{}, {}, {}, {"OD_SCLK_OFFSET": {"": -150.0}}]),
                         busy_ratio=rng.choice([None, 0.0, 0.95, c.busy_ratio]),
                         sclk_hz=rng.choice([None, 2.4e9, 2.4e9 * (1 - c.asymmetry_clock_ratio),
                                              2.4e9 * (1 - c.asymmetry_clock_ratio) * 0.999, 2.3e9, 1.8e9])))
    rules = TelemetryRules(c)
    found = [(key, event.evidence["differences"]) for key, event in rules._host(
        {x.gpu: x for x in samples}, 0.0) if key.startswith("config_asymmetry")]
    assert found == _every_pair(samples, rules)

def test_samples_that_are_not_ok_are_not_judged():
    assert run(TelemetryRules(GpuConfig()), s(state="gone", temperatures={"junction": 150.0})) == []


def test_a_power_step_from_idle_to_load_is_no_warning_a_jump_under_load_is():
    rules = TelemetryRules(GpuConfig())
    assert run(rules, s(power_watts=90.0, busy_ratio=0.0, power_cap_watts=700.0)) == []
    assert run(rules, s(power_watts=650.0, busy_ratio=1.0, power_cap_watts=700.0)) == []
    [jump] = run(rules, s(power_watts=900.0, busy_ratio=1.0, power_cap_watts=1000.0))
    assert "power jumped 650 -> 900 W under load" in jump.event.message


def h200(temp, **kw):
    return GpuSample(gpu="0000:3b:00.0", vendor="nvidia", model="NVIDIA H200", time=0.0,
                     temperatures={"gpu": temp}, temperature_limits={"gpu": (89.0, 95.0)}, **kw)


def test_the_cards_own_limits_win_where_it_reports_them():
    """An H200 slows itself at 89 °C and shuts down at 95 °C (NVML): the table's 90/100 °C would warn after it
    throttles and page after it is off."""
    rules = TelemetryRules(GpuConfig())
    assert run(rules, h200(88.0)) == []
    [warn] = run(rules, h200(89.0))
    assert warn.event.severity == Severity.WARNING and warn.event.message == "gpu temperature 89 °C on 0000:3b:00.0"
    [crit] = run(rules, h200(92.0))  # 3 °C under its shutdown
    assert crit.event.severity == Severity.CRITICAL


def test_amdgpus_crit_and_emergency_set_the_junctions_thresholds():
    """A card whose SMU throttles its junction at 110 °C and shuts down at 115 °C runs at 105 °C by design."""
    rules = TelemetryRules(GpuConfig())
    limits = {"junction": (110.0, 115.0)}
    assert run(rules, s(temperatures={"junction": 105.0}, temperature_limits=limits)) == []
    [warn] = run(rules, s(temperatures={"junction": 110.0}, temperature_limits=limits))
    assert warn.event.severity == Severity.WARNING
    # only the configured table where the card says nothing (edge here)
    [edge] = run(TelemetryRules(GpuConfig()), s(temperatures={"edge": 91.0}, temperature_limits=limits))
    assert edge.event.severity == Severity.WARNING
