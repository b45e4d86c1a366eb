"""Metric formulas on synthetic event streams with known answers."""

import pytest

from specwise.bench.load.metrics import acceptance, itl_gaps, percentile, point_metrics, request_tpot, stats, window
from specwise.bench.results import RequestRecord
from specwise.bench.load.slo import SLO, parse_slo
from specwise.errors import ConfigError


def record(send, ttft, e2e, tokens, chunks, error=None, **extra) -> RequestRecord:
    return RequestRecord(arm="a", method="off", load_kind="concurrency", load_value=1, category="chat",
                         request_id=f"r{send}", prompt_tokens=10, output_tokens=tokens, send_time=send, ttft=ttft,
                         e2e=e2e, chunk_times=chunks, error=error, **extra)


# r1: 5 tokens in 5 chunks 0.1 s apart; r2: 11 tokens in 3 chunks (speculation), r3 failed,
# r4: a single token. The point's window runs from send 0.0 to r2's finish at 0.2 + 1.3 = 1.5 s.
R1 = record(0.0, 0.1, 0.5, 5, [0.1, 0.2, 0.3, 0.4, 0.5])
R2 = record(0.2, 0.3, 1.3, 11, [0.3, 0.8, 1.3])
R3 = record(0.5, None, 0.05, 0, [], error="HTTP 500: overloaded")
R4 = record(1.0, 0.2, 0.2, 1, [0.2])
POINT = [R1, R2, R3, R4]


def test_percentiles_interpolate_linearly():
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert percentile([1, 2, 3, 4], 99) == pytest.approx(3.97)
    assert percentile([1, 2, 3, 4], 0) == 1 and percentile([1, 2, 3, 4], 100) == 4
    assert percentile([7], 99) == 7 and percentile([], 50) is None
    summary = stats([0.1, 0.3, 0.2])
    assert (summary.count, summary.mean, summary.p50) == (3, pytest.approx(0.2), 0.2)
    assert stats([]).mean is None


def test_tpot_is_decode_time_per_token_after_the_first():
    assert request_tpot(R1) == pytest.approx((0.5 - 0.1) / 4)
    assert request_tpot(R2) == pytest.approx((1.3 - 0.3) / 10)
    assert request_tpot(R3) is None and request_tpot(R4) is None


def test_itl_is_the_gap_between_chunks():
    assert itl_gaps(R1) == pytest.approx([0.1] * 4)
    assert itl_gaps(R2) == pytest.approx([0.5, 0.5])
    assert itl_gaps(R4) == []


def test_point_metrics_known_answers():
    metrics = point_metrics(POINT)
    assert (metrics.requests, metrics.completed, metrics.errors) == (4, 3, 1)
    assert metrics.error_kinds == {"HTTP 500: overloaded": 1}
    assert window(POINT) == pytest.approx(1.5) and metrics.window == pytest.approx(1.5)
    assert metrics.ttft.mean == pytest.approx(0.2) and metrics.ttft.p50 == pytest.approx(0.2)
    assert metrics.tpot.mean == pytest.approx(0.1) and metrics.tpot.count == 2
    assert metrics.itl.count == 6 and metrics.itl.mean == pytest.approx(1.4 / 6) and metrics.itl.p50 == pytest.approx(0.1)
    assert metrics.e2e.p50 == pytest.approx(0.5)
    assert metrics.output_tokens == 17
    assert metrics.output_throughput == pytest.approx(17 / 1.5)
    assert metrics.request_throughput == pytest.approx(3 / 1.5)
    assert metrics.goodput is None


def test_goodput_counts_requests_meeting_every_slo():
    assert point_metrics(POINT, SLO(ttft=0.25)).goodput == pytest.approx(2 / 1.5)             # R1, R4
    assert point_metrics(POINT, SLO(ttft=0.25, tpot=0.05)).goodput == pytest.approx(1 / 1.5)  # R4 (no TPOT)
    assert point_metrics(POINT, SLO(e2e=1.0)).goodput == pytest.approx(2 / 1.5)               # R1, R4


def test_warmup_is_excluded_and_window_can_be_shared():
    warm = record(0.0, 5.0, 9.0, 5, [5.0, 9.0], warmup=True)
    assert point_metrics([warm, R2]).requests == 1
    assert point_metrics([R2], window_s=3.0).output_throughput == pytest.approx(11 / 3.0)


def test_acceptance_sums_counters_not_ratios():
    good = record(0.0, 0.1, 1.0, 41, [0.1, 1.0], drafts=10, draft_tokens=40, accepted_tokens=30,
                  accepted_per_position=[9, 8, 7, 6])
    poor = record(0.0, 0.1, 1.0, 2, [0.1, 1.0], drafts=1, draft_tokens=4, accepted_tokens=0,
                  accepted_per_position=[0, 0, 0, 0])
    unknown = record(0.0, 0.1, 1.0, 2, [0.1, 1.0])
    pooled = acceptance([good, poor, unknown])
    assert pooled.rate == pytest.approx(30 / 44)                 # not (0.75 + 0) / 2
    assert pooled.mean_length == pytest.approx(1 + 30 / 11)     # not (4 + 1) / 2
    assert pooled.per_position == pytest.approx([9 / 11, 8 / 11, 7 / 11, 6 / 11])
    assert (pooled.drafts, pooled.draft_tokens, pooled.accepted_tokens) == (11, 44, 30)
    assert acceptance([unknown]) is None


def test_slo_parsing():
    assert parse_slo("ttft=500ms, tpot=0.05,e2e=2s") == SLO(ttft=0.5, tpot=0.05, e2e=2.0)
    assert parse_slo(None) == SLO() and not SLO().given()
    for bad in ("ttft", "latency=3", "tpot=fast", "e2e=-1"):
        with pytest.raises(ConfigError):
            parse_slo(bad)
    assert SLO.from_dict(SLO(tpot=0.1).to_dict()) == SLO(tpot=0.1)
