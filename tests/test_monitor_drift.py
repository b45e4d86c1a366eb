"""Drift and busy alerts on synthetic counter streams: a 0.6 -> 0.3 drop raises exactly one alert
within the documented delay; stationary streams (seeded, many repetitions) stay under the
documented false-alarm bound; counter resets and failed scrapes never alert."""

import json

import numpy as np
import pytest

from specwise.bench.load.targets.base import ServerAcceptance
from specwise.errors import ConfigError, InputError
from specwise.monitor.busy import BusyWatch, break_even_from_results
from specwise.monitor.drift import Baseline, CusumDetector, DriftSettings, expected_delay, std_inflation
from specwise.monitor.exposition import Snapshot
from specwise.monitor.scrape import ScrapeError
from specwise.monitor.watch import TargetWatch

K = 4
BASELINE_WINDOWS = 20
FALSE_ALARM_BOUND = 0.03        # docs/monitor.md: at most 3% of stationary 200-window streams


def alpha_for_rate(rate: float, k: int = K) -> float:
    """i.i.d. per-position acceptance whose accepted / drafted at k drafts is `rate`."""
    low, high = 0.0, 1.0
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if sum(mid ** i for i in range(1, k + 1)) / k < rate else (low, mid)
    return low


def counter_stream(rates, seed, drafts=200, mix_std=0.02, seconds=60.0, running=4.0):
    """Cumulative vLLM-like snapshots: window i has `drafts` drafts of k = 4 whose per-position
    acceptance is i.i.d. around the window's rate (plus a traffic-mix wobble of mix_std)."""
    rng = np.random.default_rng(seed)
    alphas = {rate: alpha_for_rate(rate) for rate in set(rates)}
    totals, per_position, generated = np.zeros(3), np.zeros(K), 0.0
    snapshots = [_snapshot(0.0, totals, per_position, generated, running)]
    for index, rate in enumerate(rates, start=1):
        alpha = float(np.clip(alphas[rate] + rng.normal(0, mix_std), 0, 1))
        accepted = np.cumprod(rng.random((drafts, K)) < alpha, axis=1)        # [drafts, k] prefix-wise
        per_position += accepted.sum(axis=0)
        totals += [drafts, drafts * K, accepted.sum()]
        generated += accepted.sum() + drafts + 20
        snapshots.append(_snapshot(index * seconds, totals, per_position, generated, running))
    return snapshots


def _snapshot(time, totals, per_position, generated, running):
    return Snapshot("vllm", time, ServerAcceptance("vllm", *totals.tolist(), per_position.tolist()),
                    generated, running, 0.0)


def alerts(snapshots, watch=None):
    """[(index of the scrape that raised it, kind)] over the stream."""
    watch = watch or TargetWatch("u", baseline_windows=BASELINE_WINDOWS)
    found = []
    for index, item in enumerate(snapshots):
        now = item.time if isinstance(item, Snapshot) else index * 60.0
        found += [(index, event.kind) for event in watch.observe(item, now).events if event.is_alert]
    return found


def test_worked_example_of_the_docstring():
    detector = CusumDetector(Baseline(0.6, 0.03 / std_inflation(20), 20))
    assert detector.sigma == pytest.approx(0.03)
    event = detector.update(0.30, drafts=500)
    assert event.kind == "drift" and event.statistic == pytest.approx(9.5)
    small = CusumDetector(Baseline(0.6, 0.03 / std_inflation(20), 20))
    kinds = [small.update(0.54, 500) for _ in range(6)]
    assert kinds[:5] == [None] * 5 and kinds[5].kind == "drift"


def test_drop_from_0_6_to_0_3_raises_exactly_one_alert_within_the_documented_delay():
    drop_at = 60                                     # scrape index of the first window at 0.3
    for seed in range(20):
        found = alerts(counter_stream([0.6] * (drop_at - 1) + [0.3] * 60, seed))
        assert len(found) == 1 and found[0][1] == "drift", (seed, found)
        assert drop_at <= found[0][0] <= drop_at + 2, (seed, found)     # within 3 windows


def test_documented_delay_formula():
    assert expected_delay(2.0) == 7 and expected_delay(4.0) == 3 and expected_delay(10.0) == 1
    assert expected_delay(0.4) is None


def test_stationary_streams_stay_under_the_false_alarm_bound():
    repetitions = 200
    noisy = sum(1 for seed in range(repetitions) if alerts(counter_stream([0.6] * 200, 1000 + seed)))
    assert noisy / repetitions <= FALSE_ALARM_BOUND, noisy


def test_counter_resets_and_failed_scrapes_do_not_alert():
    for seed in range(10):
        stream = counter_stream([0.6] * 120, seed)
        restarted = counter_stream([0.6] * 40, 500 + seed)[1:]             # a fresh server: counters from 0
        shifted = [Snapshot(s.server, s.time + stream[-1].time, s.acceptance, s.generation_tokens, s.running, 0.0)
                   for s in restarted]
        failures = [ScrapeError("http://u/metrics: cannot connect (refused)")] * 3
        items = stream[:50] + failures + stream[50:] + shifted + failures + stream[:0]
        assert alerts(items) == [], seed


def test_a_reset_window_is_reported_and_skipped():
    watch = TargetWatch("u", baseline=Baseline(0.6, 0.03, 20))
    stream = counter_stream([0.6] * 5, 1)
    for item in stream:
        watch.observe(item, item.time)
    observation = watch.observe(stream[1], 400.0)          # counters fell back
    assert observation.window.reset and observation.events == []
    failed = watch.observe(ScrapeError("x: cannot connect"), 460.0)
    assert failed.window.error == "x: cannot connect" and failed.events == []


def test_recovery_clears_the_alarm_and_a_second_drop_alerts_again():
    rates = [0.6] * 30 + [0.3] * 10 + [0.6] * 10 + [0.3] * 10
    found = alerts(counter_stream(rates, 3))
    assert [kind for _, kind in found] == ["drift", "drift"]


def test_saved_baseline_round_trips(tmp_path):
    baseline = Baseline.from_rates([0.58, 0.61, 0.6, 0.62], 60.0, "vllm", "u")
    baseline.save(tmp_path / "b.json")
    assert Baseline.load(tmp_path / "b.json") == baseline
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(InputError, match="not a baseline file"):
        Baseline.load(tmp_path / "bad.json")
    with pytest.raises(InputError, match="cannot read"):
        Baseline.load(tmp_path / "missing.json")


def test_busy_watch_worked_example():
    busy = BusyWatch(10.1)
    events = [busy.update(c) for c in (12, 14, 15, 16, 6)]
    assert [e.kind if e else None for e in events] == [None, None, "too_busy", None, "calm"]


def test_too_busy_alert_from_a_stream():
    watch = TargetWatch("u", baseline=Baseline(0.6, 0.03, 20), break_even=8)
    stream = counter_stream([0.6] * 10, 2, running=12.0)
    assert alerts(stream, watch) == [(3, "too_busy")]


def test_break_even_read_from_an_evaluate_summary(tmp_path):
    verdicts = [{"arm": "ngram-k4", "load_kind": "concurrency", "crossover": 10.1, "verdict": "pays ..."},
                {"arm": "draft-k4", "load_kind": "concurrency", "crossover": 6.5, "verdict": "pays ..."},
                {"arm": "ngram-k4", "load_kind": "rate", "crossover": 2.0, "verdict": "pays ..."}]
    (tmp_path / "summary.json").write_text(json.dumps({"recommendation": {"verdicts": verdicts}}))
    assert break_even_from_results(tmp_path) == 6.5
    assert break_even_from_results(tmp_path, arm="ngram-k4") == 10.1
    (tmp_path / "summary.json").write_text(json.dumps({"recommendation": {"verdicts": [
        {"arm": "ngram-k4", "load_kind": "concurrency", "crossover": None,
         "verdict": "ngram-k4 pays at concurrency 1-16; still ahead at the highest compared load"}]}}))
    with pytest.raises(ConfigError, match="no break-even recorded"):
        break_even_from_results(tmp_path)
    with pytest.raises(InputError, match="cannot read"):
        break_even_from_results(tmp_path / "nothing")


def test_settings_are_checked():
    with pytest.raises(ConfigError):
        DriftSettings(h=0)
