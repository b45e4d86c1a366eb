"""Speedup formulas against hand computations and Leviathan et al. (2023)."""

import math

import pytest

from specwise.calc.acceptance import Acceptance, alpha_from_acceptance_rate, expected_tokens_per_step
from specwise.calc.speedup import (SpeedupConfig, best_row, breakeven_alpha, minimum_alpha, speedup,
                                   speedup_table, step_cost)
from specwise.errors import ConfigError


def test_expected_tokens_hand_computed():
    # (1 - 0.8^5) / (1 - 0.8) = 0.67232 / 0.2
    assert expected_tokens_per_step(0.8, 4) == pytest.approx(3.3616)
    assert expected_tokens_per_step(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens_per_step(0.0, 7) == 1.0
    assert expected_tokens_per_step(1.0, 7) == 8.0
    assert expected_tokens_per_step(0.9, 0) == 1.0


def test_expected_tokens_is_the_series_and_tends_to_leviathan_limit():
    for alpha in (0.1, 0.55, 0.9):
        for k in (1, 3, 8):
            assert expected_tokens_per_step(alpha, k) == pytest.approx(sum(alpha ** i for i in range(k + 1)))
        # Leviathan et al. eq. 1 as gamma -> infinity: 1 / (1 - alpha)
        assert expected_tokens_per_step(alpha, 400) == pytest.approx(1 / (1 - alpha))


def test_speedup_is_leviathan_walltime_improvement_factor():
    # Theorem 3.8: (1 - a^(g+1)) / ((1 - a)(g c + 1))
    for alpha, gamma, c in ((0.8, 4, 0.05), (0.6, 3, 0.1), (0.75, 7, 0.02)):
        expected = (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1))
        assert speedup(Acceptance(alpha=alpha), gamma, c) == pytest.approx(expected)


def test_worked_example_in_docstring():
    assert speedup(Acceptance(alpha=0.8), 4, 0.05) == pytest.approx(3.3616 / 1.2)
    assert breakeven_alpha(4, 0.05) == pytest.approx(0.1668, abs=1e-3)


def test_leviathan_condition_alpha_above_c_pays():
    # Corollary: with alpha > c some gamma improves; gamma = 1 gives (1 + alpha) / (1 + c)
    for c in (0.01, 0.05, 0.2):
        assert minimum_alpha(10, c) == pytest.approx(c, abs=1e-9)
        assert speedup(Acceptance(alpha=c + 0.01), 1, c) > 1.0
        assert speedup(Acceptance(alpha=c + 0.01), 1, c) == pytest.approx((1 + c + 0.01) / (1 + c))


def test_breakeven_alpha_gives_exactly_no_speedup():
    for k, c, overhead in ((1, 0.1, 0.0), (4, 0.05, 0.1), (6, 0.02, 0.3)):
        alpha = breakeven_alpha(k, c, overhead)
        assert speedup(Acceptance(alpha=alpha), k, c, overhead) == pytest.approx(1.0, abs=1e-9)
    assert breakeven_alpha(2, 1.0) is None          # drafting costs as much as verifying: never pays
    assert breakeven_alpha(3, 0.0) == 0.0


def test_fixed_overhead_makes_longer_drafts_the_only_winners():
    # k = 1 needs alpha > 0.5; alpha/(1-alpha) > 0.5 for alpha > 1/3 as k grows
    assert breakeven_alpha(1, 0.0, 0.5) == pytest.approx(0.5)
    assert minimum_alpha(40, 0.0, 0.5) == pytest.approx(1 / 3, abs=1e-3)


def test_best_k_hand_computed():
    rows = speedup_table(Acceptance(alpha=0.8), 10, 0.05)
    by_k = {row.k: row.speedup for row in rows}
    assert by_k[7] == pytest.approx(4.1611392 / 1.35)
    assert by_k[8] == pytest.approx(4.32891136 / 1.4)
    assert by_k[9] == pytest.approx(4.463129088 / 1.45)
    assert best_row(rows).k == 8


def test_verify_cost_charges_each_extra_verified_token():
    assert step_cost(4, 0.05, 0.1, 0.2) == pytest.approx(1 + 4 * 0.25 + 0.1)
    compute_bound = speedup(Acceptance(alpha=0.7), 4, 0.0, verify_cost=1.0)
    assert compute_bound == pytest.approx(expected_tokens_per_step(0.7, 4) / 5)
    assert compute_bound < 1.0


def test_per_position_acceptance():
    measured = Acceptance(positions=(0.8, 0.6, 0.4))
    assert measured.expected_tokens(3) == pytest.approx(2.8)
    assert measured.expected_tokens(2) == pytest.approx(2.4)
    assert measured.acceptance_rate(3) == pytest.approx(0.6)
    assert len(speedup_table(measured, 10, 0.0)) == 3
    with pytest.raises(ConfigError):
        measured.rates(4)
    with pytest.raises(ConfigError):
        Acceptance(positions=(0.5, 0.7))
    with pytest.raises(ConfigError):
        Acceptance(alpha=0.5, positions=(0.5,))


def test_alpha_from_acceptance_rate_round_trip():
    for alpha in (0.3, 0.62, 0.9):
        rate = Acceptance(alpha=alpha).acceptance_rate(5)
        assert alpha_from_acceptance_rate(rate, 5) == pytest.approx(alpha, abs=1e-9)
    assert Acceptance(alpha=0.6).acceptance_rate(1) == pytest.approx(0.6)


def test_config_parses_positions_and_rejects_nonsense():
    assert SpeedupConfig(positions="0.9,0.7").acceptance().positions == (0.9, 0.7)
    with pytest.raises(ConfigError):
        SpeedupConfig().acceptance()
    with pytest.raises(ConfigError):
        SpeedupConfig(alpha=0.5, positions="0.5").acceptance()
    with pytest.raises(ConfigError):
        SpeedupConfig(alpha=1.5).acceptance()
    with pytest.raises(ConfigError):
        SpeedupConfig(draft_cost=-1)
    assert math.isfinite(speedup(Acceptance(alpha=1.0), 3, 0.1))
