"""Every engine dump in the test corpus (tests/corpus) gives what its expected.json says."""

import json

import pytest

from gpuwarden.engine.metrics import UnparsableMetrics, detect, parse
from paths import CORPUS

EXPECTED = json.loads((CORPUS / "metrics" / "expected.json").read_text()) if CORPUS.is_dir() else {}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_dump(name, corpus):
    want = EXPECTED[name]
    sample = parse((corpus / "metrics" / name).read_text())
    assert sample.profile == want["engine"]
    assert (sample.running, sample.waiting, sample.generated) == (want["running"], want["waiting"],
                                                                   want["generated_tokens"])


def test_spec_decode_acceptance(corpus):
    sample = parse((corpus / "metrics/vllm-10.prom").read_text())
    assert sample.spec_acceptance == pytest.approx(7.268642e6 / 1.0218118e7)


def test_created_series_are_ignored(corpus):
    sample = parse((corpus / "metrics/vllm-09.prom").read_text())
    assert sample.prompt == 0.0  # vllm:prompt_tokens_created (a timestamp) is not added in


def test_label_values_with_braces_and_quotes(corpus):
    sample = parse((corpus / "metrics/vllm-tgis-01.prom").read_text())
    assert (sample.profile, sample.running, sample.waiting) == ("tgi", 0.0, 0.0)


def test_latency_histogram_sum_and_count(corpus):
    sample = parse((corpus / "metrics/sglang-01.prom").read_text())
    assert (sample.latency_sum, sample.latency_count) == (3.116093850019932e6, 11228.0)


def test_unknown_and_malformed_bodies():
    assert detect("node_cpu_seconds_total 1\n") is None
    with pytest.raises(UnparsableMetrics):
        parse("<html>not metrics</html>")
    with pytest.raises(UnparsableMetrics):
        parse('vllm:num_requests_running{model_name="x} 1\n')
