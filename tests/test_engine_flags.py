"""The one translation of a method into engine flags: what the recommendation prints is what
the launcher starts (bench/engine_flags.py, bench/report/server_configs.py)."""

import json
import shlex

import pytest

from specwise.bench.engine_flags import speculative_flags, vllm_limits
from specwise.bench.load.arms import parse_engine_methods
from specwise.bench.load.metrics import PointMetrics, Stats
from specwise.bench.report.recommend import recommend
from specwise.bench.report.server_configs import sglang_flags, vllm_config
from specwise.bench.report.summary import ALL, Row, Summary, add_speedups
from specwise.errors import ConfigError

METHODS = "off,ngram@4,ngram:1-3@2,suffix@3,suffix:16:0@5,draft:/models/small@3,eagle:/models/eagle@2,eagle3:/models/e3"


def _metrics(tpot_ms: float) -> PointMetrics:
    return PointMetrics(requests=10, completed=10, errors=0, error_kinds={}, window=10.0, ttft=Stats(),
                        tpot=Stats(count=10, mean=tpot_ms / 1000), itl=Stats(), e2e=Stats(), prompt_tokens=0,
                        output_tokens=0, request_throughput=None, output_throughput=100.0, goodput=None,
                        acceptance=None)


def _methods(engine: str) -> str:
    """SGLang (0.5.23) has no suffix decoding."""
    return METHODS if engine == "vllm" else ",".join(m for m in METHODS.split(",") if not m.startswith("suffix"))


def _recommendation(engine: str):
    """Every engine arm pays at concurrency 1 and 4 against off."""
    arms = [arm.to_dict() for arm in parse_engine_methods(_methods(engine), engine, 4)]
    rows = [Row(arm["name"], arm["method"], "concurrency", load, ALL, _metrics(40 if arm["method"] == "off" else 20))
            for arm in arms for load in (1, 4)]
    summary = Summary(tool="evaluate", run={}, baseline="off", arms=arms, slo={}, rows=rows, notes=[])
    add_speedups(summary)
    return arms, recommend(summary)


@pytest.mark.parametrize("engine,key", [("vllm", "vllm_args"), ("sglang", "sglang")])
def test_launched_flags_equal_what_the_recommendation_prints(engine, key):
    arms, recommendation = _recommendation(engine)
    printed = {config["spec"]: config for config in recommendation.configs}
    speculative = [arm for arm in arms if arm["method"] != "off"]
    assert len(speculative) == (7 if engine == "vllm" else 5) and set(printed) == {arm["spec"] for arm in speculative}
    for arm in speculative:
        launched = speculative_flags(engine, arm["spec"], arm["method"], arm["k"])
        assert shlex.split(printed[arm["spec"]][key]) == launched, arm["name"]


def test_vllm_configs_of_each_method():
    flags = {arm.name: speculative_flags("vllm", arm.spec, arm.method, arm.k)
             for arm in parse_engine_methods(METHODS, "vllm", 4)}
    configs = {name: json.loads(words[1]) for name, words in flags.items() if words}
    assert flags["off"] == []
    assert configs["ngram-k2"] == {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1,
                                   "prompt_lookup_max": 3}
    assert configs["suffix-k5"] == {"method": "suffix", "num_speculative_tokens": 5,
                                    "suffix_decoding_max_tree_depth": 16, "suffix_decoding_max_cached_requests": 0}
    assert configs["draft-small-k3"] == {"method": "draft_model", "model": "/models/small", "num_speculative_tokens": 3}
    assert configs["eagle3-e3-k4"] == {"method": "eagle3", "model": "/models/e3", "num_speculative_tokens": 4}


def test_sglang_chain_flags():
    arm = next(a for a in parse_engine_methods("eagle3:/models/e3@3", "sglang", 4))
    assert speculative_flags("sglang", arm.spec, arm.method, arm.k) == [
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/models/e3",
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def test_sglang_has_no_suffix_decoding():
    assert sglang_flags("suffix", "suffix", 4)["sglang"] is None
    assert "no suffix decoding" in sglang_flags("suffix", "suffix", 4)["sglang_note"]
    with pytest.raises(ConfigError, match="sglang cannot run it .SGLang .0.5.23. has no suffix decoding"):
        parse_engine_methods("off,suffix", "sglang", 4)


def test_our_own_heads_point_at_their_export_and_a_servers_checkpoint_is_taken_as_it_is():
    """eagle:DIR from an in-process arm is specwise's head format: vLLM gets the exported directory, SGLang none."""
    assert vllm_config("eagle:/heads/mine", "eagle", 3, [])["vllm"]["model"] == "/heads/mine/export-vllm"
    assert sglang_flags("eagle:/heads/mine", "eagle", 3)["sglang"] is None
    assert vllm_config("eagle:/ckpt", "eagle", 3, [], checkpoint="server")["vllm"]["method"] == "eagle"


@pytest.mark.parametrize("text,message", [("lookahead", "with --engine use"), ("layer_skip:4", "with --engine use"),
                                          ("draft", "cannot run it"), ("ngram@99", "@k must be"),
                                          ("ngram,ngram", "arm given twice")])
def test_engine_methods_refused_in_one_line(text, message):
    with pytest.raises(ConfigError, match=message) as error:
        parse_engine_methods(text, "vllm", 4)
    assert "\n" not in str(error.value)


def test_the_recommendation_says_what_suffix_needs_in_vllm():
    assert "arctic-inference" in vllm_config("suffix", "suffix", 4, [])["vllm_note"]
    assert vllm_config("ngram", "ngram", 4, [])["vllm_note"] == ""


def test_the_limits_a_vllm_command_line_sets():
    """Both spellings; a flag without a number, or with none after it, sets nothing; other flags are not limits."""
    argv = ["vllm", "serve", "m", "--max-num-seqs", "128", "--max-num-batched-tokens=2048", "--block-size", "x",
            "--max-model-len", "2048", "--enforce-eager"]
    assert vllm_limits(argv) == {"max_num_seqs": 128, "max_num_batched_tokens": 2048}
    assert vllm_limits(["vllm", "serve", "m", "--block-size"]) == {}
    assert vllm_limits(["--block-size", "16"]) == {"block_size": 16}
