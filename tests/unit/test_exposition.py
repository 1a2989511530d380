"""The exposition text written straight from the snapshot (exposition.py) is what prometheus_client wrote: byte for
byte against its generate_latest over the same families (the collector the exporter used until issue 27, kept
here as the reference), and family by family through its parser, odd label values and values included."""

import math
import os

import pytest
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.core.families import FAMILIES, Family
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.web import exposition

ODD = ["", "plain", 'a "quoted" name', "back\\slash", "new\nline", "\\n literally", "ünïcødé ☃", "trailing\\",
       "{braces}=,", "tab\there"]
VALUES = [0.0, 1.0, -2.5, 0.1, 1e-7, 123456.0, 1234567.0, 1796312617.544893, 3.0e20, 2 ** 53 + 0.0]


def reference(snapshot) -> str:
    """What prometheus_client's generate_latest wrote for this snapshot (the exporter's old _Collector)."""
    class Collector:
        def collect(self):
            for name in [n for n in FAMILIES if n in snapshot]:
                series, family = snapshot[name], FAMILIES[name]
                cls = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
                metric = cls(name.removesuffix("_total"), family.doc, labels=family.labels)
                for labels, value in sorted(series.items()):
                    metric.add_metric(labels, value)
                yield metric
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    return generate_latest(registry).decode()


def every_family() -> SelfMetrics:
    """Every declared family set, each with several series: odd label values in every position, every kind of
    value."""
    metrics = SelfMetrics()
    for i, family in enumerate(FAMILIES.values()):
        for j in range(3 if family.labels else 1):
            labels = tuple(ODD[(i + j + k) % len(ODD)] + str(j) for k in range(len(family.labels)))
            value = VALUES[(i + j) % len(VALUES)]
            if family.kind == "counter":
                metrics.inc(family, *labels, by=abs(value))
            else:
                metrics.set(family, value, *labels)
    return metrics


def test_the_text_is_prometheus_clients_byte_for_byte():
    snapshot = every_family().snapshot()
    assert len(snapshot) == len(FAMILIES)  # the check sees every family
    text = exposition.render(snapshot).decode()
    assert text == reference(snapshot)
    assert '\\"quoted\\"' in text and "new\\nline" in text and "back\\\\slash" in text  # escaped, not dropped


def test_every_family_parses_back_to_what_was_set():
    snapshot = every_family().snapshot()
    parsed = {f.name: f for f in text_string_to_metric_families(exposition.render(snapshot).decode())}
    assert [name for name in parsed] == [name.removesuffix("_total") for name in FAMILIES]  # declaration order
    for name, family in FAMILIES.items():
        got = parsed[name.removesuffix("_total")]
        assert (got.type, got.documentation) == (family.kind, family.doc)
        samples = {tuple(s.labels[k] for k in family.labels): s.value for s in got.samples if s.name == name}
        assert samples == snapshot[name], name


def test_special_values_and_escaped_help_are_written_as_prometheus_client_does(monkeypatch):
    """SelfMetrics keeps NaN and Inf out, but the writer must not be the one that gets them wrong; a HELP with a
    backslash or a newline is escaped."""
    monkeypatch.setitem(FAMILIES, "test_odd_help", Family("test_odd_help", "gauge", "a \\ and\na newline", ("x",)))
    snapshot = {"test_odd_help": {("a",): math.inf, ("b",): -math.inf, ("c",): math.nan, ("d",): -0.0},
                "gpuwarden_loop_lag_seconds": {(): 5e-324}}
    text = exposition.render(snapshot).decode()
    assert text == reference(snapshot)
    assert "# HELP test_odd_help a \\\\ and\\na newline\n" in text and 'x="a"} +Inf' in text


def test_an_empty_family_is_still_described():
    """A family replaced by no series (every GPU gone) says HELP and TYPE, as before."""
    snapshot = {"gpuwarden_gpu_power_watts": {}}
    assert exposition.render(snapshot).decode() == reference(snapshot)


def test_process_families_are_process_collectors():
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    theirs = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    mine = {f.name: f for f in text_string_to_metric_families(exposition.Process().render())}
    assert list(mine) == list(theirs)
    for name, family in mine.items():
        assert (family.type, family.documentation) == (theirs[name].type, theirs[name].documentation)
    value = {name: family.samples[0].value for name, family in mine.items()}
    other = {name: family.samples[0].value for name, family in theirs.items()}
    for name in ("process_start_time_seconds", "process_max_fds"):
        assert value[name] == other[name], name
    assert value["process_cpu_seconds"] >= other["process_cpu_seconds"] > 0
    assert abs(value["process_open_fds"] - len(os.listdir("/proc/self/fd"))) <= 2
    assert value["process_resident_memory_bytes"] > 1 << 20 and value["process_virtual_memory_bytes"] > 1 << 20


def test_without_proc_there_are_no_process_families(tmp_path):
    assert exposition.Process(str(tmp_path)).render() == ""


@pytest.mark.parametrize("value", [*VALUES, -1234567.0, 1e100, 1e-100])
def test_numbers_are_floattogostrings(value):
    from prometheus_client.utils import floatToGoString

    assert exposition.number(value) == floatToGoString(value)


def test_a_family_written_again_only_when_it_moved():
    """The text of a family that did not move is the last one's; one that moved, or lost or gained a series, is
    written anew (each scrape compared with prometheus_client's)."""
    metrics = every_family()
    first = exposition.render(metrics.snapshot()).decode()
    metrics.set("gpuwarden_gpu_power_watts", 123.25, "g9", "amd", "m")  # a new series
    metrics.inc("gpuwarden_events_total", "k", "s", by=2)  # a moved counter
    snapshot = metrics.snapshot()
    second = exposition.render(snapshot).decode()
    assert second == reference(snapshot) != first
    assert 'gpuwarden_gpu_power_watts{gpu="g9",model="m",vendor="amd"} 123.25' in second
    metrics.replace("gpuwarden_gpu_power_watts", {})  # every GPU gone
    snapshot = metrics.snapshot()
    assert exposition.render(snapshot).decode() == reference(snapshot)
    assert 'gpu="g9"' not in exposition.render(snapshot).decode()


def test_a_label_value_that_is_not_utf8_does_not_break_the_scrape():
    """A name decoded from bytes with surrogateescape (a path, a process) holds a lone surrogate, which UTF-8
    cannot carry: its series says "?" there, and every other series is still written."""
    metrics = SelfMetrics()
    metrics.set("gpuwarden_gpu_power_watts", 1.5, "g0", "amd", b"card\xff".decode(errors="surrogateescape"))
    text = exposition.render(metrics.snapshot()).decode()
    assert 'gpuwarden_gpu_power_watts{gpu="g0",model="card?",vendor="amd"} 1.5' in text
    assert [f.name for f in text_string_to_metric_families(text)][:1] == ["gpuwarden_build_info"]
