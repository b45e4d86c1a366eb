"""Speculative counters read from Prometheus text: vLLM, our own server, SGLang; vLLM's KV cache."""

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily

from specwise.bench.load.targets.base import ServerAcceptance
from specwise.bench.load.targets.prometheus import (acceptance_from_samples, add, difference, parse_exposition,
                                                    vllm_cache_limits)

VLLM = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 20.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 480.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 300.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 110.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 90.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 60.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="3"} 40.0
vllm:num_requests_running{model_name="m"} 3.0
"""


def test_parse_exposition_lines():
    samples = parse_exposition('a_total{x="1",path="say \\"hi\\""} 2.5 1700000000\n# c\nbad line\nb NaN\nc +Inf\n')
    assert samples[0] == ("a_total", {"x": "1", "path": 'say "hi"'}, 2.5)
    assert samples[1][0] == "b" and samples[1][2] != samples[1][2]      # NaN
    assert samples[2] == ("c", {}, float("inf"))
    assert len(samples) == 3


def test_vllm_counters_are_summed_over_engines():
    found = acceptance_from_samples(parse_exposition(VLLM))
    assert found == ServerAcceptance(source="vllm", drafts=120.0, draft_tokens=480.0, accepted_tokens=300.0,
                                     accepted_per_position=[110.0, 90.0, 60.0, 40.0])


def test_our_own_server_format_as_prometheus_client_writes_it():
    class Collector:
        def collect(self):
            yield CounterMetricFamily("specwise:spec_decode_num_drafts", "d", value=10)
            yield CounterMetricFamily("specwise:spec_decode_num_draft_tokens", "t", value=40)
            yield CounterMetricFamily("specwise:spec_decode_num_accepted_tokens", "a", value=25)
            positions = CounterMetricFamily("specwise:spec_decode_num_accepted_tokens_per_pos", "p",
                                            labels=["position"])
            positions.add_metric(["0"], 9)
            positions.add_metric(["1"], 7)
            yield positions

    registry = CollectorRegistry()
    registry.register(Collector())
    found = acceptance_from_samples(parse_exposition(generate_latest(registry).decode()))
    assert (found.source, found.drafts, found.draft_tokens, found.accepted_tokens) == ("specwise", 10, 40, 25)
    assert found.accepted_per_position == [9, 7]


def test_sglang_gauges_are_reported_as_they_are():
    text = ('sglang:spec_accept_length{model_name="m",tp_rank="0"} 3.2\n'
            'sglang:spec_accept_rate{model_name="m",tp_rank="0"} 0.55\n')
    found = acceptance_from_samples(parse_exposition(text))
    assert (found.source, found.rate, found.length, found.drafts) == ("sglang", 0.55, 3.2, None)
    assert difference(ServerAcceptance("sglang", rate=0.1, length=1.2), found) is found


def test_difference_of_two_scrapes():
    before = ServerAcceptance("vllm", drafts=100, draft_tokens=400, accepted_tokens=250, accepted_per_position=[90])
    after = ServerAcceptance("vllm", drafts=130, draft_tokens=520, accepted_tokens=310,
                             accepted_per_position=[110, 12])
    counted = difference(before, after)
    assert (counted.drafts, counted.draft_tokens, counted.accepted_tokens) == (30, 120, 60)
    assert counted.accepted_per_position == [20, 12]
    assert difference(before, None) is None
    assert difference(None, after) is after


def test_block_differences_add_up_and_gauges_keep_the_later_reading():
    first = ServerAcceptance("vllm", drafts=30, draft_tokens=120, accepted_tokens=60, accepted_per_position=[20, 12])
    second = ServerAcceptance("vllm", drafts=5, draft_tokens=20, accepted_tokens=9, accepted_per_position=[4])
    both = add(first, second)
    assert (both.drafts, both.draft_tokens, both.accepted_tokens) == (35, 140, 69)
    assert both.accepted_per_position == [24, 12]
    assert add(None, second) is second and add(first, None) is first
    gauge = ServerAcceptance("sglang", rate=0.5, length=2.0)
    assert add(ServerAcceptance("sglang", rate=0.1, length=1.2), gauge) is gauge


def test_no_speculative_metrics_means_unknown():
    assert acceptance_from_samples(parse_exposition("vllm:num_requests_running 1\n")) is None
    partial = "vllm:spec_decode_num_drafts_total 3\n"
    assert acceptance_from_samples(parse_exposition(partial)) is None


@pytest.mark.parametrize("text", ["", "garbage\n", "# only comments\n"])
def test_empty_pages(text):
    assert acceptance_from_samples(parse_exposition(text)) is None


def test_vllms_kv_cache_is_read_from_its_cache_config_info():
    """A real vLLM for CPU 0.32 page (2 GiB of KV for SmolLM2-135M): 728 blocks of 128 tokens. A page without
    the gauge says nothing; one whose block count is not a number says the block size alone."""
    page = (Path(__file__).parent / "data" / "vllm-0.32-cpu-ngram-metrics.txt").read_text()
    assert vllm_cache_limits(page) == {"block_size": 128, "kv_cache_tokens": 93184}
    assert vllm_cache_limits(VLLM) == {}
    unknown = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n'
    assert vllm_cache_limits(unknown) == {"block_size": 16, "kv_cache_tokens": None}
