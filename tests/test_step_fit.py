"""The linear step-cost fit (engine/step_fit.py): known coefficients recovered from a synthetic
engine, residuals kept, a one-line refusal for a sweep too short to fit, and a linear profile
read by the simulator and the calculators."""

import json

import numpy as np
import pytest

from specwise.engine.step_fit import LinearStepCost, StepSample, fit, grid_samples
from specwise.engine.step_profile import load_step_cost
from specwise.errors import ConfigError

FIXED, PER_TOKEN, PER_KV = 0.004, 3e-4, 2e-6        # the synthetic engine's known step time


def synthetic_step(tokens, kv_tokens, rng) -> float:
    """A step's time: the known function, with +-1% measurement noise."""
    return (FIXED + PER_TOKEN * tokens + PER_KV * kv_tokens) * (1 + rng.uniform(-0.01, 0.01))


def sweep(batch_sizes=(1, 2, 4, 8, 16), tokens_per_seq=(1, 2, 5), contexts=(0, 128, 512, 1024), seed=0):
    rng = np.random.default_rng(seed)
    return [StepSample(b * t, b * c, synthetic_step(b * t, b * c, rng))
            for b in batch_sizes for t in tokens_per_seq for c in contexts]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recovers_the_known_coefficients_within_2_percent(seed):
    result = fit(sweep(seed=seed))
    cost = result.cost
    assert cost.fixed_s == pytest.approx(FIXED, rel=0.02)
    assert cost.per_token_s == pytest.approx(PER_TOKEN, rel=0.02)
    assert cost.per_kv_token_s == pytest.approx(PER_KV, rel=0.02)
    assert np.abs(result.relative_residuals).max() < 0.03          # the noise, nothing more
    assert "residuals over 60 steps" in result.summary() and len(result.residual_lines()) == 60


def test_a_model_that_does_not_fit_shows_in_its_residuals():
    """Step time quadratic in the tokens: the straight line misses by far more than noise."""
    samples = [StepSample(t, c, 0.001 + 1e-6 * t * t) for t in (1, 10, 100, 400) for c in (0, 1000)]
    assert np.abs(fit(samples).relative_residuals).max() > 0.3


@pytest.mark.parametrize("samples", [
    sweep(batch_sizes=(1,), tokens_per_seq=(1,), contexts=(0, 512)),             # 2 steps
    sweep(batch_sizes=(1, 2, 4, 8), tokens_per_seq=(1,), contexts=(0,)),         # one KV size
    [StepSample(t, 10 * t, 0.001 * t + 0.01) for t in range(1, 9)],              # KV moves with tokens
], ids=["two steps", "one KV size", "collinear"])
def test_refuses_a_sweep_too_short_to_fit(samples):
    with pytest.raises(ConfigError, match="too short to fit") as error:
        fit(samples)
    assert "\n" not in str(error.value)


def test_grid_samples_read_a_profile_grid():
    samples = grid_samples([1, 4], [1, 5], [0, 100], np.arange(8).reshape(2, 2, 2) / 10)
    assert samples[-1] == StepSample(20, 400, 0.7) and samples[1] == StepSample(1, 100, 0.1)


def test_a_linear_profile_is_a_step_cost_model(tmp_path):
    path = tmp_path / "linear.json"
    path.write_text(json.dumps({"format": "specwise-step-profile", "version": 1, "model": "m", "machine": "x",
                                "linear": {"fixed_s": FIXED, "per_token_s": PER_TOKEN, "per_kv_token_s": PER_KV}}))
    cost = load_step_cost(path)
    assert isinstance(cost, LinearStepCost)
    # 8 sequences verifying 1 + 4 rows over 300 cached tokens each
    assert cost.step_time(8, 5, 300) == pytest.approx(FIXED + PER_TOKEN * 40 + PER_KV * 2400)
    assert cost.prefill_time([100, 50]) == pytest.approx(FIXED + PER_TOKEN * 150)


def test_an_optional_term_that_comes_out_negative_is_fitted_away():
    """TTFTs 4 ms *faster* than the prefill steps they hold (noise a few requests can give): the overhead
    would come out -4 ms, which the simulator cannot admit by; it is fitted away (0) and the other
    coefficients are those of the same samples fitted without it."""
    steps = [StepSample(b * t, b * c, FIXED + PER_TOKEN * b * t + PER_KV * b * c)
             for b in (1, 4, 16) for t in (1, 2) for c in (100, 800)]
    ttfts = [StepSample(n, 0.0, FIXED + PER_TOKEN * n - 0.004 + 1e-5 * (n % 7), logits_rows=1, first_token=True)
             for n in (30, 230, 900)]
    result = fit(steps + ttfts)
    assert result.cost.request_overhead_s == 0 and result.cost.per_logits_row_s >= 0
    plain = fit(steps + [StepSample(s.tokens, s.kv_tokens, s.seconds, logits_rows=1) for s in ttfts])
    assert result.cost.to_json() == pytest.approx(plain.cost.to_json())
    assert np.allclose(result.predicted, plain.predicted)


def test_a_kv_token_that_costs_less_than_nothing_is_fitted_away():
    """Steps that get *faster* with more KV (a noisy sweep on a busy machine fitted -3.5 us a KV token):
    the fit keeps it at 0 and solves fixed + per token without it, by the same relative least squares."""
    steps = [StepSample(t, c, 0.030 + 0.0005 * t - 1e-6 * c) for t in (1, 4, 16, 64) for c in (500, 5000)]
    result = fit(steps)
    assert result.cost.per_kv_token_s == 0 and result.cost.per_logits_row_s == 0
    seconds = np.array([s.seconds for s in steps])
    design = np.array([[1.0, s.tokens] for s in steps]) / seconds[:, None]
    fixed, per_token = np.linalg.lstsq(design, np.ones(len(steps)), rcond=None)[0]
    assert (result.cost.fixed_s, result.cost.per_token_s) == pytest.approx((fixed, per_token))
    assert result.predicted == pytest.approx(fixed + per_token * np.array([s.tokens for s in steps]))
