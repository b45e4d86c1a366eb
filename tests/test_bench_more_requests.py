""""Can't tell" points: how many more requests would decide them, or why no count can be given.

Rows are constructed with known paired estimates and intervals; nothing is measured.
"""

import pytest

from specwise.bench.load.metrics import PointMetrics, Stats
from specwise.bench.report.html import render_html
from specwise.bench.report.markdown import render_markdown
from specwise.bench.report.recommend import UNSURE, MoreRequests, more_requests, recommend
from specwise.bench.report.summary import ALL, Row, Summary
from specwise.bench.report.tables import speedup_table

WITHIN = "its estimate lies between break-even and the 5% margin, so more requests may not decide it"
NO_INTERVAL = "too few of its requests measure tpot_mean to give an interval"


def more(n=10, s=1.30, s_range=(1.02, 1.60), t=1.20, t_range=(1.10, 1.30)) -> MoreRequests:
    return more_requests(n, "tpot_mean", s, list(s_range) if s_range else None, t,
                         list(t_range) if t_range else None, margin=0.05, floor=0.97)


def test_counts_where_the_estimates_point_to_a_decision():
    # the module doc's worked example: 10 * (0.28 / 0.25)**2 = 12.5 -> 13 pairs, 3 more
    assert more() == MoreRequests(3)
    assert more().text() == "about 3 more requests per arm would decide"
    # below break-even: the upper bound 1.05 must fall under 1: 10 * (0.15 / 0.10)**2 = 22.5 -> 13 more
    assert more(s=0.90, s_range=(0.80, 1.05), t=1.0, t_range=(0.95, 1.05)).count == 13
    # latency clears the margin, throughput below its floor: high(t) must fall under 0.97,
    # 10 * (0.10 / 0.07)**2 = 20.4 -> 11 more (the point will lose on throughput)
    assert more(s=1.30, s_range=(1.20, 1.40), t=0.90, t_range=(0.80, 1.00)).count == 11
    # both pointing to a loss: the nearer one (latency 13, throughput 10 * (0.05 / 0.02)**2 -> 63 pairs)
    assert more(s=0.90, s_range=(0.80, 1.05), t=0.95, t_range=(0.90, 1.00)).count == 13
    # paying on latency, throughput above its floor but its interval reaching under it: the larger
    assert more(s=1.30, s_range=(1.20, 1.40), t=1.00, t_range=(0.91, 1.09)).count == 80   # 10 * 3**2 = 90
    # too few pairs for any interval: at least this many more
    assert more(n=3, s_range=None, t_range=None) == MoreRequests(2)


def test_each_reason_for_no_count_has_its_wording():
    assert more(s=1.02, s_range=(0.95, 1.10)).text() == WITHIN
    assert more(s=1.05, s_range=(0.95, 1.15)).text() == WITHIN                     # exactly on the margin
    assert more(s=1.20, s_range=None).text() == NO_INTERVAL
    assert more(t=None, t_range=None).text() == "output throughput has no interval"
    assert more(t=0.97, t_range=(0.90, 1.04)).text() == "its throughput ratio sits exactly on the 97% floor"
    assert all(more(**case).count is None for case in (dict(s=1.02, s_range=(0.95, 1.10)), dict(s_range=None)))


def metrics() -> PointMetrics:
    return PointMetrics(requests=10, completed=10, errors=0, error_kinds={}, window=10.0, ttft=Stats(),
                        tpot=Stats(count=10, mean=0.04), itl=Stats(), e2e=Stats(count=10, p50=0.8), prompt_tokens=0,
                        output_tokens=0, request_throughput=1.0, output_throughput=25.0, goodput=None,
                        acceptance=None)


# load -> (tpot_mean speedup, its interval, throughput ratio, its interval), 10 pairs each
POINTS = {1: (1.30, [1.02, 1.60], 1.20, [1.10, 1.30]),       # count: 3 more
          2: (1.02, [0.95, 1.10], 1.00, [0.98, 1.02]),       # within the margin
          4: (1.20, None, 1.10, [1.05, 1.15]),               # no latency interval
          8: (0.90, [0.80, 1.05], 0.95, [0.90, 1.00]),       # count: 13 more (toward a loss)
          16: (1.02, [0.90, 1.10], 1.00, [0.95, 1.05])}      # within the margin


def mixed_summary() -> Summary:
    arms = [{"name": "off", "method": "off"}, {"name": "ngram-k4", "method": "ngram"}]
    rows = []
    for load, (s, s_range, t, t_range) in POINTS.items():
        rows.append(Row("off", "off", "concurrency", load, ALL, metrics()))
        intervals = {"tpot_mean": s_range, "output_throughput": t_range}
        rows.append(Row("ngram-k4", "ngram", "concurrency", load, ALL, metrics(),
                        speedup={"tpot_mean": s, "output_throughput": t}, paired=10,
                        intervals={key: value for key, value in intervals.items() if value}))
    return Summary(tool="evaluate", run={}, baseline="off", arms=arms, slo={}, rows=rows, notes=[])


@pytest.fixture(scope="module")
def mixed():
    summary = mixed_summary()
    return summary, recommend(summary)


def test_the_verdict_gives_counts_and_reasons_never_a_question_mark(mixed):
    verdict = mixed[1].verdicts[0]
    assert set(verdict.calls.values()) == {UNSURE}
    assert verdict.verdict == (
        "ngram-k4 is not shown to pay at any measured concurrency (needs 1.05x tpot_mean with throughput kept)."
        " Can't tell at concurrency 1, 2, 4, 8, 16 at this sample size: about 3, 13 more requests per arm would"
        f" decide concurrency 1, 8; at 2, 16 {WITHIN}; at 4 {NO_INTERVAL}.")


def test_one_kind_of_answer_keeps_the_short_sentence():
    summary = mixed_summary()
    summary.rows = [row for row in summary.rows if row.load_value in (2, 16)]
    summary.__post_init__()
    assert recommend(summary).verdicts[0].verdict.endswith(
        f" Can't tell at concurrency 2, 16 at this sample size ({WITHIN}).")
    summary = mixed_summary()
    summary.rows = [row for row in summary.rows if row.load_value in (1, 8)]
    summary.__post_init__()
    assert recommend(summary).verdicts[0].verdict.endswith(
        " Can't tell at concurrency 1, 8 at this sample size (about 3, 13 more requests per arm would decide).")


def test_table_markdown_and_html_word_it_the_same(mixed):
    summary, recommendation = mixed
    cells = {row[1]: row[-1] for row in speedup_table(summary, recommendation).rows}
    assert cells["concurrency 1"] == "can't tell (about 3 more requests per arm would decide)"
    assert cells["concurrency 2"] == f"can't tell ({WITHIN})"
    assert cells["concurrency 4"] == f"can't tell ({NO_INTERVAL})"
    markdown, page = render_markdown(summary, recommendation), render_html(summary, recommendation)
    for text in (markdown, page):
        assert WITHIN in text and NO_INTERVAL in text and "about 3, 13 more requests per arm" in text
        assert "about ?" not in text and "?, " not in text
