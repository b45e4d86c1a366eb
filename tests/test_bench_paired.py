"""Trustworthy verdicts: paired requests, bootstrap intervals, three-valued verdicts.

Synthetic records with known per-request latencies: request i has its own base TPOT
(prompts differ a lot), each arm multiplies it by independent noise, and the arm is
`true_speedup` times faster. Nothing here measures time: the records are constructed.
"""

import numpy as np
import pytest

from specwise.bench.report.recommend import LOSES, PAYS, UNSURE, recommend
from specwise.bench.report.summary import summarize
from specwise.bench.results import RequestRecord
from specwise.bench.stats.bootstrap import t_quantile, tail_levels
from specwise.bench.stats.paired import compare, pair

ARMS = [{"name": "off", "method": "off", "spec": None, "k": 0},
        {"name": "ngram-k4", "method": "ngram", "spec": "ngram", "k": 4}]
TOKENS = 21


def record(arm: str, index: int, tpot: float, load: int = 1, error: str | None = None) -> RequestRecord:
    ttft = 0.05
    e2e = ttft + tpot * (TOKENS - 1)
    return RequestRecord(arm=arm, method=arm.split("-")[0], load_kind="concurrency", load_value=load,
                         category="chat", request_id=f"r{index}", prompt_tokens=50, output_tokens=TOKENS,
                         send_time=float(index), ttft=ttft, e2e=e2e, error=error, round=0)


def synthetic(n: int, true_speedup: float, seed: int, noise: float = 0.15, load: int = 1):
    rng = np.random.default_rng(seed)
    base = 0.04 * rng.lognormal(0.0, 0.5, n)                  # per-request TPOT without speculation
    off = base * rng.lognormal(0.0, noise, n)
    spec = base / true_speedup * rng.lognormal(0.0, noise, n)
    return ([record("off", i, t, load) for i, t in enumerate(off)]
            + [record("ngram-k4", i, t, load) for i, t in enumerate(spec)])


def run_info(seed: int = 0) -> dict:
    return {"tool": "evaluate", "arms": ARMS, "baseline": "off", "config": {"seed": seed},
            "criteria": {"pay_metric": "tpot_mean", "margin": 0.05, "throughput_floor": 0.97, "confidence": 0.95}}


def calls(records, seed: int = 0):
    verdict = recommend(summarize(records, run_info(seed))).verdicts[0]
    return verdict


def test_expanded_percentile_levels():
    assert t_quantile(0.975, 9) == pytest.approx(2.262, abs=0.01)
    assert t_quantile(0.975, 1000) == pytest.approx(1.96, abs=0.01)
    low, high = tail_levels(10, 0.95)
    assert low == pytest.approx(0.86, abs=0.05) and high == pytest.approx(99.14, abs=0.05)


def test_a_true_ratio_of_one_is_covered_in_at_least_95_percent_of_repetitions():
    covered = 0
    repetitions = 300
    for seed in range(repetitions):
        records = synthetic(12, 1.0, seed)
        pairs = pair([r for r in records if r.arm == "ngram-k4"], [r for r in records if r.arm == "off"])
        interval = compare(pairs, ["tpot_mean"], seed=seed).intervals["tpot_mean"]
        covered += interval.low <= 1.0 <= interval.high
    assert covered / repetitions >= 0.95


def test_no_difference_at_small_n_is_cant_tell_never_pays():
    for seed in range(20):
        verdict = calls(synthetic(8, 1.0, seed), seed)
        assert verdict.calls[1] in (UNSURE, LOSES) and verdict.calls[1] != PAYS
        assert verdict.calls[1] == UNSURE or verdict.intervals[1][1] < 1.0
    verdict = calls(synthetic(8, 1.0, 3))
    assert "Can't tell at concurrency 1 at this sample size" in verdict.verdict or "margin" in verdict.verdict


def test_a_true_1_3x_pays_once_n_is_large_enough():
    small = calls(synthetic(4, 1.3, 1, noise=0.4), 1)
    assert small.calls[1] == UNSURE and small.more_requests[1].count == 1      # 5 pairs give an interval
    assert "more requests per arm would decide" in small.verdict
    large = calls(synthetic(200, 1.3, 1, noise=0.4), 1)
    assert large.calls[1] == PAYS and large.intervals[1][0] >= 1.05
    assert large.speedup[1] == pytest.approx(1.3, rel=0.1)


def test_a_true_slowdown_loses():
    verdict = calls(synthetic(100, 0.7, 2), 2)
    assert verdict.calls[1] == LOSES and verdict.intervals[1][1] < 1.0
    assert verdict.pays_at == []


def test_pairs_leave_out_requests_one_arm_did_not_complete():
    records = synthetic(20, 1.3, 5)
    spec = [r for r in records if r.arm == "ngram-k4"]
    spec[3].error = "timed out"                            # failed in the arm
    del spec[7]                                            # never finished in the arm (cut off)
    off = [r for r in records if r.arm == "off"]
    off[11].error = "HTTP 500"                             # failed in the baseline
    pairs = pair(spec, off)
    ids = {a.request_id for a, _ in pairs}
    assert len(pairs) == 17 and not ids & {"r3", "r7", "r11"}
    assert all(a.request_id == b.request_id and not a.error and not b.error for a, b in pairs)
    summary = summarize(spec + off, run_info())
    row = summary.row("ngram-k4", "concurrency", 1)
    assert row.paired == 17
    expected = np.mean([request_tpot(b) for _, b in pairs]) / np.mean([request_tpot(a) for a, _ in pairs])
    assert row.speedup["tpot_mean"] == pytest.approx(expected)
    assert any("ratios use the 17 both completed" in note for note in summary.notes)


def request_tpot(record):
    return (record.e2e - record.ttft) / (record.output_tokens - 1)


def test_intervals_are_seeded_and_reproducible():
    records = synthetic(30, 1.2, 9)
    first = summarize(records, run_info(4)).row("ngram-k4", "concurrency", 1).intervals
    again = summarize(records, run_info(4)).row("ngram-k4", "concurrency", 1).intervals
    assert first == again and set(first) >= {"tpot_mean", "e2e_mean", "e2e_p50", "output_throughput"}


def test_verdicts_drive_the_server_configs():
    """A 1.3x arm on 4 requests is "can't tell": the config keeps speculation off there."""
    records = synthetic(4, 1.3, 1, noise=0.4) + synthetic(200, 1.3, 1, noise=0.4, load=2)
    recommendation = recommend(summarize(records, run_info(1)))
    verdict = recommendation.verdicts[0]
    assert verdict.calls == {1: UNSURE, 2: PAYS}
    assert recommendation.best_arm["concurrency"] == {1: "off", 2: "ngram-k4"}
    ngram = recommendation.configs[0]
    assert ngram["batch_size_table"][0][2] == 0             # k = 0 where the run could not tell
