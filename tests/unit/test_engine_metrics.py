"""Every engine dump in the test corpus (tests/corpus) gives what its expected.json says."""

import json
import subprocess
import sys

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
    assert sample.progress == 0.0  # vllm:prompt_tokens_created (a timestamp) is not added in


def test_label_values_with_braces_and_quotes(corpus):
    sample = parse((corpus / "metrics/vllm-tgis-01.prom").read_text())
    assert (sample.profile, sample.running, sample.waiting) == ("tgi", 0.0, 0.0)


def test_request_timing_when_progress_moves_only_as_requests_end(corpus):
    sample = parse((corpus / "metrics/sglang-01.prom").read_text())  # an SGLang without realtime_tokens_total
    assert not sample.per_step
    assert sample.timing == (3.116093850019932e6, 11228.0) and sample.first_token is None


def test_llamacpp_progress_is_the_per_step_decode_counter(corpus):
    """tokens_predicted_total moves only when a request ends; n_decode_total moves on every decode."""
    sample = parse((corpus / "metrics/llamacpp-04.prom").read_text())
    assert sample.per_step and "llamacpp:n_decode_total" in sample.families
    older = parse((corpus / "metrics/llamacpp-01.prom").read_text())  # a build without n_decode_total
    assert not older.per_step and older.progress == 673 + 143


def test_detection_reads_the_whole_body(corpus):
    """prometheus_client's default registry prints python_gc_*, python_info and process_* before any engine
    family, as a real vLLM does: detection must not stop at the first line."""
    preamble = ('# HELP python_gc_objects_collected_total Objects collected during gc\n'
                '# TYPE python_gc_objects_collected_total counter\n'
                'python_gc_objects_collected_total{generation="0"} 1234.0\n'
                'python_info{implementation="CPython",major="3",minor="12"} 1.0\n'
                'process_cpu_seconds_total 12.5\n')
    body = preamble + (corpus / "metrics/vllm-07.prom").read_text()
    assert detect(body).name == "vllm"
    sample = parse(body)
    assert (sample.profile, sample.running, sample.generated) == ("vllm", 0, 955)


def test_progress_is_any_token_processed():
    """A long prefill moves the prompt counter while the generated-token counter stands still."""
    def body(prompt, generated):
        return (f"vllm:num_requests_running 1\nvllm:prompt_tokens_total {prompt}\n"
                f"vllm:generation_tokens_total {generated}\n")
    before, after = parse(body(1000, 50)), parse(body(9192, 50))
    assert before.generated == after.generated and after.progress > before.progress


def test_nan_and_infinite_samples_say_nothing():
    sample = parse("vllm:num_requests_running NaN\nvllm:generation_tokens_total +Inf\n"
                   "vllm:prompt_tokens_total 5\nvllm:num_requests_waiting 2\n")
    assert sample.running is None and sample.generated is None and sample.waiting == 2
    assert sample.progress == 5


def test_an_explicit_profile_needs_its_metrics_in_the_body(corpus):
    with pytest.raises(UnparsableMetrics, match="none of vllm's metrics"):
        parse((corpus / "metrics/llamacpp-04.prom").read_text(), "vllm")
    assert parse((corpus / "metrics/vllm-05.prom").read_text(), "vllm").running is None  # declared, no samples


def test_unknown_and_malformed_bodies():
    assert detect("node_cpu_seconds_total 1\n") is None
    with pytest.raises(UnparsableMetrics):
        parse("<html>not metrics</html>")
    with pytest.raises(UnparsableMetrics):
        parse('vllm:num_requests_running{model_name="x} 1\n')


def test_the_kv_cache_in_use_is_each_engines_activity(corpus):
    """vLLM's KV-cache usage moves chunk by chunk through a prefill; SGLang's token_usage likewise."""
    assert parse((corpus / "metrics/vllm-cpu-0.32-busy.prom").read_text()).activity == pytest.approx(
        0.0009766817238432424)
    assert parse((corpus / "metrics/sglang-01.prom").read_text()).activity == pytest.approx(0.28)
    assert parse((corpus / "metrics/llamacpp-04.prom").read_text()).activity is None  # n_decode_total moves
    old = "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.5\nvllm:num_requests_running 1\n"
    assert parse(old).activity == 0.5


def test_a_parse_reads_timestamps_exemplars_and_escaped_label_values_and_loads_no_other_parser(corpus):
    """The lines are read by engine/metrics.py itself (prometheus_client's parser made a family, a dict of labels
    and a sample object of each line, and was 30 ms to import): what that parser accepted, it reads the same."""
    body = ('vllm:num_requests_running{model="a } b",note="say \\"hi\\"\\\\"} 2 1700000000000\n'
            'vllm:num_requests_running{model="c"} 1\n'
            'vllm:num_requests_waiting\t3\n'
            'vllm:generation_tokens_total 1e+06 # {trace_id="x"} 1.0\n')
    sample = parse(body)
    assert (sample.running, sample.waiting, sample.generated) == (3, 3, 1e6)
    for bad in ('vllm:num_requests_running{model="a} 1\n', "vllm:num_requests_running 1_000\n"):
        with pytest.raises(UnparsableMetrics):
            parse(bad)
    code = (f"from gpuwarden.engine.metrics import parse\nparse(open({str(corpus / 'metrics/vllm-01.prom')!r}).read())"
            "\nimport sys\nprint('prometheus_client' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
