"""Published GPU sweeps (specwise/calc/data/published_sweeps.json) and their predictions on paper.

Nothing here pins today's error: the data file is checked for form, the prediction for being the
calculators' own, and the summary against hand computation.
"""

import json
from pathlib import Path

import pytest

from specwise.calc.arms import parse_arm
from specwise.calc.catalog import gpu_names
from specwise.calc.roofline import RooflineCost
from specwise.calc.throughput import decode_rates
from specwise.engine.cost.linear_cost import LinearStepCost
from specwise.errors import ConfigError
from specwise.sim.published import (ROLES, Prediction, PublishedPoint, deployment_for, load_points,
                                    load_step_time_fits, median_abs_error, not_reproduced, predict,
                                    predict_with_fits)

DOCS = Path(__file__).resolve().parent.parent / "docs" / "published_sweeps.md"

SERIES = {
    "id": "toy", "citation": "A. Author: a paper (2025), Table 1", "url": "https://example.org/paper",
    "where": "Table 1", "engine": "some engine", "gpu": "h100-sxm", "tp": 1, "model": "llama-3.1-8b",
    "metric": "throughput with / without speculation", "arm": "eagle:k=3,rate=0.6,cost=0.05",
    "prompt_tokens": 128, "output_tokens": 256, "role": "held_out",
    "points": [{"load": 1, "published": 1.5}, {"load": 32, "published": 1.2, "arm": "eagle:k=2,rate=0.6,cost=0.05"}],
}


FIT = {"id": "toy-fit", "citation": "B. Author: a simulator, predictor.py", "url": "https://example.org/sim",
       "engine": "some engine", "gpu": "h100", "tp": 1, "model": "llama-3.1-8b-instruct",
       "fixed_s": 0.006, "per_token_s": 2e-5, "per_kv_token_s": 4e-8}


def write(tmp_path, *series, fits=(), not_reproduced_entries=()) -> Path:
    path = tmp_path / "sweeps.json"
    path.write_text(json.dumps({"series": list(series), "step_time_fits": list(fits),
                                "not_reproduced": list(not_reproduced_entries)}))
    return path


def point(published: float, role: str) -> PublishedPoint:
    return PublishedPoint(series="s", citation="c", url="u", where="w", engine="e", gpu="h100-sxm", tp=1,
                          model="llama-3.1-8b", arm="ngram:k=4,alpha=0.6", load_kind="batch", load=1,
                          prompt_tokens=1, output_tokens=1, metric="m", published=published, role=role)


def test_the_package_data_names_a_source_and_a_setup_for_every_point():
    points = load_points()
    assert points and any(p.role == "held_out" for p in points)
    for p in points:
        assert p.citation and p.where and p.engine and p.metric, p.series
        assert p.url.startswith("https://"), p.series
        assert p.role in ROLES
        assert p.role == "held_out" or p.fitted, f"{p.series}: a fit point says what was fitted on it"
        assert p.prompt_tokens > 0 and p.output_tokens > 0 and p.load > 0 and p.published > 0
        deployment = deployment_for(p)
        parse_arm(p.arm, RooflineCost(deployment), deployment)          # the arm is one the calculators take
    assert all(fit.citation and fit.url.startswith("https://") and fit.engine for fit in load_step_time_fits())
    for entry in not_reproduced():
        assert entry["citation"] and entry["url"].startswith("https://") and entry["published"] and entry["reason"]


def test_a_point_inherits_its_series_setup_and_may_override_the_arm(tmp_path):
    first, second = load_points(write(tmp_path, SERIES))
    assert (first.citation, first.gpu, first.arm, first.load) == (SERIES["citation"], "h100-sxm", SERIES["arm"], 1)
    assert second.arm == "eagle:k=2,rate=0.6,cost=0.05" and second.load_kind == "batch"


@pytest.mark.parametrize("change, message", [
    ({"citation": ""}, "missing citation"),
    ({"url": None}, "missing url"),
    ({"role": "tuned"}, "role must be one of"),
    ({"role": "fit"}, "says what was fitted"),
    ({"load_kind": "trace"}, "load_kind must be one of"),
    ({"gpu": "rtx-3090"}, "unknown gpu"),
    ({"points": [{"load": 4, "published": 0}]}, "published > 0"),
])
def test_a_malformed_series_is_refused_in_one_line(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        load_points(write(tmp_path, {**SERIES, **change}))


def test_a_batch_point_is_predicted_by_the_throughput_calculator(tmp_path):
    """No second cost model: the prediction is decode_rates' ratio at context prompt + output / 2,
    on the catalog's defaults plus the per-pass overhead asked for."""
    for overhead in (0.0, 2.0):
        for p in load_points(write(tmp_path, SERIES)):
            deployment = deployment_for(p, overhead)
            assert deployment.forward_overhead_s == overhead / 1e3
            cost = RooflineCost(deployment)
            expected = decode_rates(cost, parse_arm(p.arm, cost, deployment), int(p.load), 128 + 256 / 2).ratio
            assert predict(p, overhead) == pytest.approx(expected, rel=1e-12)


def test_a_published_step_time_fit_stands_in_for_the_roofline_on_the_points_it_covers(tmp_path):
    """It covers a point of the same GPU, tp and model whatever the aliases; its prediction is
    decode_rates' ratio on engine/cost/linear_cost.py's LinearStepCost with the fit's coefficients."""
    other_tp = {**SERIES, "id": "toy-tp2", "tp": 2, "points": [{"load": 4, "published": 1.1}]}
    path = write(tmp_path, SERIES, other_tp, fits=[FIT])
    points, fits = load_points(path), load_step_time_fits(path)
    first, second, on_two_gpus = predict_with_fits(points, fits)
    assert on_two_gpus is None
    cost = LinearStepCost(0.006, 2e-5, 4e-8)
    deployment = deployment_for(points[1])
    expected = decode_rates(cost, parse_arm(points[1].arm, cost, deployment), 32, 128 + 256 / 2).ratio
    assert second.predicted == pytest.approx(expected, rel=1e-12)
    assert first.point is points[0] and first.predicted != predict(points[0])


def test_a_step_time_fit_without_a_coefficient_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="missing 'per_kv_token_s'"):
        load_step_time_fits(write(tmp_path, fits=[{k: v for k, v in FIT.items() if k != "per_kv_token_s"}]))
    with pytest.raises(ConfigError, match=">= 0"):
        load_step_time_fits(write(tmp_path, fits=[{**FIT, "fixed_s": -1}]))


def test_a_rate_point_gains_at_low_load_and_less_at_high_load(tmp_path):
    series = {**SERIES, "load_kind": "rate", "arm": "ngram:k=4,alpha=0.8", "prompt_tokens": 16, "output_tokens": 128,
              "points": [{"load": 0.5, "published": 2.0}, {"load": 400, "published": 1.0}]}
    low, high = (predict(p) for p in load_points(write(tmp_path, series)))
    assert low > 1.5
    assert high < low


def test_median_error_equals_a_hand_computation_on_two_points():
    # published 1.50, predicted 1.65: +10%; published 2.00, predicted 1.50: -25%
    held_out = Prediction(point(1.5, "held_out"), 1.65)
    fit = Prediction(point(2.0, "fit"), 1.5)
    assert held_out.error == pytest.approx(0.10)
    assert fit.error == pytest.approx(-0.25)
    assert median_abs_error([held_out, fit]) == pytest.approx(0.175)
    assert median_abs_error([held_out, fit], "held_out") == pytest.approx(0.10)
    assert median_abs_error([held_out, fit], "fit") == pytest.approx(0.25)
    assert median_abs_error([fit], "held_out") is None


def test_the_docs_say_for_every_catalog_gpu_what_checks_it_and_cite_every_series():
    text = DOCS.read_text(encoding="utf-8")
    for name in gpu_names():
        assert f"`{name}`" in text, f"docs/published_sweeps.md says nothing of {name}"
    for url in {p.url for p in load_points()} | {fit.url for fit in load_step_time_fits()}:
        assert url in text, f"docs/published_sweeps.md does not cite {url}"
