"""The recommendation on constructed results with known answers."""

import math

import pytest

from specwise.bench.load.metrics import PointMetrics, Stats
from specwise.bench.report.recommend import contiguous_ranges, crossover, recommend
from specwise.bench.report.summary import ALL, Row, Summary, add_speedups
from specwise.engine.spec_decode.config import DEFAULT_MAX_N, DEFAULT_MIN_N

LOADS = [1, 2, 4, 8, 16]
# mean TPOT (ms) and output throughput (tok/s) per concurrency
RESULTS = {
    "off":             ([40, 42, 45, 50, 60], [25, 48, 90, 160, 260]),
    "ngram-k4":        ([25, 28, 36, 55, 75], [37.5, 67.2, 108, 152, 208]),          # speedup 1.6 .. 0.8
    "ngram-k2":        ([30, 30, 37.5, 47, 62.5], [32.5, 62.4, 99, 156.8, 234]),     # pays up to 8
    "layer_skip-8-k4": ([44, 46, 50, 56, 66], [23, 44, 82, 150, 240]),               # never pays
    "fast-but-costly": ([30, 42, 45, 50, 60], [24, 48, 90, 160, 260]),               # 1.33x TPOT, 96% throughput
}
ARMS = [{"name": "off", "method": "off", "spec": None, "k": 0},
        {"name": "ngram-k4", "method": "ngram", "spec": "ngram", "k": 4},
        {"name": "ngram-k2", "method": "ngram", "spec": "ngram", "k": 2},
        {"name": "layer_skip-8-k4", "method": "layer_skip", "spec": "layer_skip:8", "k": 4},
        {"name": "fast-but-costly", "method": "http", "spec": None, "k": None}]
# at concurrency 1, per category: (off TPOT, ngram-k4 TPOT, ngram-k4 acceptance)
CATEGORIES = {"code_editing": (40, 20, 0.8), "chat": (40, 39, 0.2)}


def metrics(tpot_ms: float, throughput: float, acceptance_rate=None) -> PointMetrics:
    from specwise.bench.load.metrics import acceptance_stats
    accepted = None if acceptance_rate is None else acceptance_stats(100, 400, 400 * acceptance_rate)
    return PointMetrics(requests=10, completed=10, errors=0, error_kinds={}, window=10.0, ttft=Stats(),
                        tpot=Stats(count=10, mean=tpot_ms / 1000), itl=Stats(), e2e=Stats(), prompt_tokens=0,
                        output_tokens=0, request_throughput=None, output_throughput=throughput, goodput=None,
                        acceptance=accepted)


def constructed_summary(missing=()) -> Summary:
    """`missing`: (arm, load) pairs left out, as when no request finished there."""
    rows = []
    for arm in ARMS:
        tpots, throughputs = RESULTS[arm["name"]]
        for load, tpot, throughput in zip(LOADS, tpots, throughputs):
            if (arm["name"], load) not in missing:
                rows.append(Row(arm["name"], arm["method"], "concurrency", load, ALL, metrics(tpot, throughput)))
        for category, (off_tpot, k4_tpot, accepted) in CATEGORIES.items():
            if arm["name"] in ("off", "ngram-k4"):
                spec = arm["name"] == "ngram-k4"
                rows.append(Row(arm["name"], arm["method"], "concurrency", 1, category,
                                metrics(k4_tpot if spec else off_tpot, 10.0, accepted if spec else None)))
    summary = Summary(tool="simulate", run={"engine": {"max_num_seqs": 64}}, baseline="off", arms=ARMS, slo={},
                      rows=rows, notes=[])
    add_speedups(summary)
    return summary


@pytest.fixture(scope="module")
def recommendation():
    return recommend(constructed_summary())


def verdict(recommendation, arm):
    return next(v for v in recommendation.verdicts if v.arm == arm)


def test_where_each_arm_pays(recommendation):
    assert verdict(recommendation, "ngram-k4").pays_at == [1, 2, 4]
    assert verdict(recommendation, "ngram-k2").pays_at == [1, 2, 4, 8]
    assert verdict(recommendation, "layer_skip-8-k4").pays_at == []
    # 1.33x faster at concurrency 1, but 96% of the throughput: not paying
    assert verdict(recommendation, "fast-but-costly").pays_at == []
    assert verdict(recommendation, "ngram-k4").ranges == [(1, 4)]


def test_crossover_is_log_interpolated(recommendation):
    # ngram-k4: 1.25x at 4, 50/55 = 0.909x at 8 -> 4 * 2 ** (0.25 / (0.25 + 0.0909))
    s4, s8 = 45 / 36, 50 / 55
    expected = 4 * 2 ** ((s4 - 1) / (s4 - s8))
    assert verdict(recommendation, "ngram-k4").crossover == pytest.approx(expected)
    assert expected == pytest.approx(6.65, abs=0.01)
    assert verdict(recommendation, "layer_skip-8-k4").crossover is None


def test_sentences_and_category_notes(recommendation):
    k4 = verdict(recommendation, "ngram-k4")
    assert k4.verdict == "ngram-k4 pays at concurrency 1-4; break-even near concurrency 6.65."
    assert k4.category_notes == ["At concurrency 1, ngram-k4 pays on code_editing (2.00x, acceptance 80%); "
                                 "not on chat (1.03x, acceptance 20%)."]
    never = verdict(recommendation, "layer_skip-8-k4").verdict
    assert never.startswith("layer_skip-8-k4 does not pay at any measured concurrency")


def test_best_arm_per_load(recommendation):
    assert recommendation.best_arm["concurrency"] == {1: "ngram-k4", 2: "ngram-k4", 4: "ngram-k4",
                                                      8: "ngram-k2", 16: "off"}


def test_server_configs_with_batch_size_table(recommendation):
    ngram = next(c for c in recommendation.configs if c["spec"] == "ngram")
    assert ngram["k"] == 4 and ngram["pays"]
    assert ngram["batch_size_table"] == [[1, 7, 4], [8, 15, 2], [16, 64, 0]]
    assert ngram["vllm"] == {"method": "ngram", "num_speculative_tokens": 4,
                             "prompt_lookup_min": DEFAULT_MIN_N, "prompt_lookup_max": DEFAULT_MAX_N}
    assert ngram["vllm_dynamic"]["num_speculative_tokens_per_batch_size"] == [[1, 7, 4], [8, 15, 2], [16, 64, 0]]
    assert ngram["vllm_args"].startswith("--speculative-config '{\"method\": \"ngram\"")
    assert ngram["sglang"] == "--speculative-algorithm NGRAM --speculative-num-draft-tokens 5"
    layer_skip = next(c for c in recommendation.configs if c["spec"] == "layer_skip:8")
    assert layer_skip["vllm"] is None and layer_skip["sglang"] is None and not layer_skip["pays"]
    assert "layer-skip" in layer_skip["vllm_note"]
    assert all(c["spec"] is not None for c in recommendation.configs)    # no config for the endpoint arm


def test_draft_model_flags():
    from specwise.bench.report.server_configs import sglang_flags, vllm_config
    vllm = vllm_config("draft:/models/small", "draft", 3, [])
    assert vllm["vllm"] == {"method": "draft_model", "model": "/models/small", "num_speculative_tokens": 3}
    assert vllm["vllm_dynamic"] is None
    assert sglang_flags("draft:/models/small", "draft", 3)["sglang"] == (
        "--speculative-algorithm STANDALONE --speculative-draft-model-path /models/small "
        "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4")


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_head_configs_point_at_the_exported_directory(kind):
    from specwise.bench.report.server_configs import sglang_flags, vllm_config
    vllm = vllm_config(f"{kind}:/runs/head", kind, 4, [])
    assert vllm["vllm"] == {"method": kind, "model": "/runs/head/export-vllm", "num_speculative_tokens": 4}
    assert f"specwise export-drafter /runs/head --format vllm --out /runs/head/export-vllm" in vllm["vllm_note"]
    builtin = vllm_config(kind, kind, 4, [])                      # the built-in head: no directory to point at
    assert builtin["vllm"] is None and "specwise export-drafter DIR --format vllm" in builtin["vllm_note"]
    sglang = sglang_flags(f"{kind}:/runs/head", kind, 4)
    assert sglang["sglang"] is None and ("final norm" if kind == "eagle" else "no Medusa") in sglang["sglang_note"]


def test_stricter_margin_shrinks_the_range():
    strict = recommend(constructed_summary(), margin=0.3)
    assert verdict(strict, "ngram-k4").pays_at == [1, 2]          # 1.6x, 1.5x; not 1.25x


def test_helpers():
    assert contiguous_ranges([1, 2, 4, 8], [True, True, False, True]) == [(1, 2), (8, 8)]
    assert contiguous_ranges([1, 2], [False, False]) == []
    assert crossover([1, 2, 4], [1.5, 1.2, 1.1]) is None
    assert crossover([1, 2, 4], [0.9, 0.8, 0.7]) is None
    assert crossover([2, 8], [1.5, 0.5]) == pytest.approx(math.sqrt(2 * 8))      # halfway on a log scale
    assert crossover([1, 2, 4], [1.2, None, 0.8]) == pytest.approx(2.0)


def test_loads_without_figures_are_named():
    k2 = verdict(recommend(constructed_summary(missing={("off", 8), ("off", 16)})), "ngram-k2")
    assert k2.pays_at == [1, 2, 4] and k2.not_compared == [8, 16]
    assert k2.verdict == ("ngram-k2 pays at concurrency 1-4; still ahead at the highest compared load "
                          "(concurrency 4). Not compared at concurrency 8, 16: no request finished there in "
                          "this arm or the baseline.")
