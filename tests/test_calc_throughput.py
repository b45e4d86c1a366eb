"""Throughput calculator, arms and k policies."""

import numpy as np
import pytest

from specwise.calc.acceptance import expected_tokens_per_step
from specwise.calc.arms import OFF, parse_arm
from specwise.calc.deployment import Deployment, DeploymentConfig
from specwise.calc.drafter import ModelDraftCost, NoDraftCost, RelativeDraftCost
from specwise.calc.roofline import RooflineCost
from specwise.calc.throughput import (ThroughputConfig, batch_grid, crossover, decode_rates, describe_switches,
                                      max_batch, switches, throughput_table)
from specwise.errors import ConfigError


@pytest.fixture(scope="module")
def h100():
    d = Deployment.from_config(DeploymentConfig(model="llama-3.1-8b", gpu="h100-sxm"))
    return d, RooflineCost(d)


def test_batch_one_ratio_is_the_speedup_formula(h100):
    d, cost = h100
    arm = parse_arm("eagle:k=4,alpha=0.8,cost=0.05", cost, d)
    row = decode_rates(cost, arm, 1, 1000)
    verify = cost.step_time(1, 5, 1000) / cost.step_time(1, 1, 1000)
    assert row.ratio == pytest.approx(expected_tokens_per_step(0.8, 4) / (verify + 4 * 0.05))
    assert row.off_tokens_per_s == pytest.approx(1 / cost.step_time(1, 1, 1000))


def test_speculation_stops_paying_at_large_batch_on_short_contexts(h100):
    d, cost = h100
    arm = parse_arm("draft:k=4,alpha=0.8,drafter=llama-3.2-1b", cost, d)
    rows = throughput_table(cost, arm, 300, batch_grid(512))
    assert rows[0].ratio > 1.5 and rows[-1].ratio < 1.0
    stop = crossover(cost, arm, 300, rows)
    assert decode_rates(cost, arm, stop, 300).ratio < 1.0 <= decode_rates(cost, arm, stop - 1, 300).ratio
    assert "stops paying from" in describe_switches(rows, switches(cost, arm, 300, rows))


def test_magicdec_long_context_speedup_grows_with_batch():
    """Self-speculation with a 512-token KV budget (MagicDec's StreamingLLM drafter): on short
    contexts the gain shrinks with batch size, on long ones it grows."""
    d = Deployment.from_config(DeploymentConfig(model="llama-3.1-8b", gpu="a100-80gb", tp=8))
    cost = RooflineCost(d)
    arm = parse_arm("selfspec:k=3,alpha=0.8,drafter=llama-3.1-8b,budget=512", cost, d)
    short = [row.ratio for row in throughput_table(cost, arm, 512, [1, 16, 64, 128])]
    long = [row.ratio for row in throughput_table(cost, arm, 16384, [1, 16, 64, 128])]
    assert short == sorted(short, reverse=True) and short[-1] < 1.0
    assert long == sorted(long) and long[-1] > 1.5
    assert switches(cost, arm, 16384, throughput_table(cost, arm, 16384, [1, 16, 64, 128]))[0][1] is True


def test_kv_limit_counts_drafter_and_lookahead(h100):
    d, cost = h100
    ngram = parse_arm("ngram:k=4,alpha=0.5", cost, d)
    draft = parse_arm("draft:k=4,alpha=0.5,drafter=llama-3.2-1b", cost, d)
    assert max_batch(d, ngram, 1000, 1000, 100000) == d.memory_plan().kv_capacity_tokens // 2004
    assert max_batch(d, draft, 1000, 1000, 100000) < max_batch(d, ngram, 1000, 1000, 100000)
    assert max_batch(d, ngram, 1000, 1000, 64) == 64
    assert batch_grid(40) == [1, 2, 4, 8, 16, 32, 40] and batch_grid(8) == [1, 2, 4, 8]


def test_arm_parsing(h100):
    d, cost = h100
    assert parse_arm("off", cost, d) is OFF
    ngram = parse_arm("ngram:k=3,positions=0.7/0.5/0.3", cost, d)
    assert (ngram.name, ngram.k_for(100), isinstance(ngram.draft, NoDraftCost)) == ("ngram-k3", 3, True)
    assert ngram.acceptance_for("chat").expected_tokens(3) == pytest.approx(2.5)
    adaptive = parse_arm("draft:policy=1=5/32=3/128=0,alpha=0.8,drafter=llama-3.2-1b,name=dyn", cost, d)
    assert adaptive.name == "dyn" and [adaptive.k_for(b) for b in (1, 31, 32, 200)] == [5, 5, 3, 0]
    assert isinstance(adaptive.draft, ModelDraftCost) and adaptive.drafter.model.name == "llama-3.2-1b"
    assert parse_arm("ngram:alpha=0.5", cost, d).name == "ngram-k4"
    rated = parse_arm("medusa:k=2,rate=0.5,cost=0.1", cost, d)
    assert rated.acceptance["*"].acceptance_rate(2) == pytest.approx(0.5)
    assert isinstance(rated.draft, RelativeDraftCost)
    for bad in ("draft:k=4,alpha=0.8", "ngram:k=4", "ngram:k=4,alpha=0.5,speed=2", "off:k=1",
                "ngram:k=4,alpha=0.5,positions=0.5", "ngram:k=2,positions=0.5", "draft:k=2,alpha=0.5,budget=4,cost=0.1",
                ":k=1", "ngram:k=4,alpha=x"):
        with pytest.raises(ConfigError):
            parse_arm(bad, cost, d)


def test_relative_and_budgeted_draft_costs(h100):
    _, cost = h100
    relative = RelativeDraftCost(cost, 0.1)
    total = np.array([8000.0])
    assert relative.draft_times(8, 3, total, total)[0] == pytest.approx(0.3 * cost.step_time(8, 1, 1000))
    budgeted = ModelDraftCost(cost, kv_budget=256)
    assert budgeted.draft_times(8, 2, total, np.array([2048.0]))[0] == pytest.approx(2 * cost.step_time(8, 1, 256))


def test_throughput_config(h100):
    d, cost = h100
    config = ThroughputConfig(k=3, positions="0.8,0.6,0.5", draft_cost=0.02, batch_sizes="8,1,8")
    arm = config.arm(cost, d)
    assert arm.name == "draft-k3" and config.batch_list() == [1, 8]
    with pytest.raises(ConfigError):
        ThroughputConfig(alpha=0.7).arm(cost, d)
    with pytest.raises(ConfigError):
        ThroughputConfig(batch_sizes="a").batch_list()
    with pytest.raises(ConfigError):
        decode_rates(cost, OFF, 1, 100)
