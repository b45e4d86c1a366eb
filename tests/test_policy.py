"""The k-per-step policies: static, table, and auto on a synthetic step-cost model."""

import pytest

from specwise.errors import ConfigError
from specwise.engine.spec_decode.policy import AutoPolicy, StaticPolicy, TablePolicy


def memory_then_compute_bound(batch_size: int, tokens_per_seq: int, context_len: int) -> float:
    """40 ms of weight reads per step, plus 2 ms of compute per token in the step."""
    return max(0.040, 0.002 * batch_size * tokens_per_seq)


def trained_policy(acceptance: float, max_k: int = 4) -> AutoPolicy:
    policy = AutoPolicy(max_k, memory_then_compute_bound, explore_every=10**9)
    for draft in range(400):
        # accept each position with probability `acceptance`, as a deterministic pattern
        accepted = 0
        while accepted < max_k and (draft * 7 + accepted * 13) % 100 < acceptance * 100:
            accepted += 1
        policy.observe(max_k, accepted)
    return policy


def test_static_policy_always_returns_k():
    assert [StaticPolicy(3).choose_k(batch, 100) for batch in (1, 64)] == [3, 3]


def test_table_policy_follows_batch_thresholds():
    policy = TablePolicy.parse("1=4/8=2/32=0", max_k=4)
    assert [policy.choose_k(batch, 0) for batch in (1, 7, 8, 31, 32, 64)] == [4, 4, 2, 2, 0, 0]


@pytest.mark.parametrize("text", ["8=2", "1=9", "1:4", "x", "1=4,8=2"])
def test_table_policy_rejects_bad_tables(text):
    with pytest.raises(ConfigError):
        TablePolicy.parse(text, max_k=4)


def test_auto_speculates_where_it_wins_and_stops_where_it_loses():
    policy = trained_policy(acceptance=0.7)
    # batch 1: the step is memory-bound, verifying 1 + k tokens costs the same as 1
    assert policy.choose_k(1, 100) == 4
    # batch 64: compute-bound, every extra token is paid in full; speculation loses
    assert policy.choose_k(64, 100) == 0


def test_auto_turns_off_when_acceptance_is_poor_even_at_batch_one():
    policy = AutoPolicy(4, lambda batch, tokens, context: 0.040 * tokens, explore_every=10**9)
    for _ in range(200):
        policy.observe(4, 0)
    assert policy.choose_k(1, 100) == 0


def test_auto_counts_drafting_cost():
    policy = trained_policy(acceptance=0.7)
    assert policy.choose_k(1, 100) > 0
    policy.observe_drafting(seconds=1.0, batch_size=1, k=4)     # a very slow drafter
    policy.observe_drafting(seconds=1.0, batch_size=1, k=4)
    assert policy.choose_k(1, 100) == 0


def test_auto_explores_after_a_run_of_steps_off():
    policy = AutoPolicy(4, lambda batch, tokens, context: 0.040 * tokens, explore_every=5)
    for _ in range(200):
        policy.observe(4, 0)
    choices = [policy.choose_k(1, 100) for _ in range(10)]
    assert choices == [0, 0, 0, 0, 4, 0, 0, 0, 0, 4]


def test_expected_tokens_matches_the_worked_example():
    policy = AutoPolicy(2, memory_then_compute_bound, prior_weight=1e-9)
    for _ in range(10):
        policy.observe(2, 2)
        policy.observe(2, 2)
        policy.observe(2, 1)
        policy.observe(2, 0)
        policy.observe(2, 2)
    # position 0 accepted 4 of 5, position 1 accepted 3 of the 4 that reached it
    assert policy.conditional_acceptance() == pytest.approx([0.8, 0.75], abs=0.02)
    assert policy.expected_tokens(2) == pytest.approx(1 + 0.8 + 0.6, abs=0.03)


def test_auto_with_levels_counts_positions_from_the_level_and_cost_from_its_rows():
    """A draft-tree proposer (lookahead 4,3,4 at k 2: 16 rows verify 2 positions) offers off or its full size:
    the tokens come from 2 positions, the cost from 1 + 16 tokens per sequence."""
    policy = AutoPolicy(16, memory_then_compute_bound, explore_every=10**9, levels=[(0, 0), (16, 2)])
    for _ in range(400):
        policy.observe(2, 2)                       # every step accepts both positions: 3 tokens per step
    assert policy.expected_tokens(2) == pytest.approx(3.0, abs=0.1)      # the prior still weighs a little
    # batch 1: 17 tokens cost 40 ms like 1 -> on; batch 16: 16 * 17 * 2 ms = 544 ms for 3x the tokens -> off
    assert policy.choose_k(1, 100) == 16
    assert policy.choose_k(16, 100) == 0
    assert {policy.choose_k(batch, 100) for batch in (1, 2, 4, 8, 16, 32)} <= {0, 16}
