"""What the user sees while a run goes."""

import io

from specwise.bench.load.arrivals import LoadPoint
from specwise.bench.load.metrics import point_metrics
from specwise.bench.load.progress import LiveView, PlainView, make_view
from specwise.bench.results import RequestRecord


def finished(error=None):
    return RequestRecord("ngram-k4", "ngram", "concurrency", 4, "chat", "r", 10, 5, 0.0, ttft=0.1, e2e=0.5,
                         chunk_times=[0.1, 0.5], error=error, drafts=2, draft_tokens=8, accepted_tokens=6)


def test_plain_view_prints_one_line_per_point():
    stream = io.StringIO()
    view = PlainView(stream)
    view.arm_started("ngram-k4")
    view.point_done("ngram-k4", LoadPoint("concurrency", 4), point_metrics([finished(), finished("HTTP 503: busy")]))
    assert stream.getvalue().splitlines() == [
        "arm ngram-k4",
        "  load=concurrency 4  ok=1  errors=1  TTFT p50=100 ms  TPOT mean=100 ms  e2e p50=500 ms  "
        "out tok/s=10.0  acceptance=75%  first error: HTTP 503: busy"]


def test_live_view_runs_without_a_terminal():
    assert isinstance(make_view(True), PlainView)           # pytest's stderr is not a terminal
    view = LiveView()
    view.arm_started("off")
    view.point_started("off", LoadPoint("rate", 2.0), expected=2)
    view.request_done(finished())
    view.request_done(finished("timed out"))
    view.point_done("off", LoadPoint("rate", 2.0), point_metrics([finished(), finished("timed out")]))
    view.close()
    assert view.table.row_count == 1 and view.errors == 1


def test_cut_off_requests_are_shown():
    stream = io.StringIO()
    PlainView(stream).point_done("off", LoadPoint("concurrency", 16), point_metrics([]), cut_off=16)
    assert stream.getvalue().rstrip().endswith("ok=0  errors=0  TTFT p50=-  TPOT mean=-  e2e p50=-  out tok/s=-  "
                                               "acceptance=-  cut off at the time limit: 16")
