"""The report's tables as plain (header, rows) data, rendered by report_md and report_html."""

from dataclasses import dataclass

from specwise.bench.load.arrivals import LoadPoint
from specwise.bench.load.metrics import PointMetrics
from specwise.bench.report.recommend import Recommendation
from specwise.bench.report.summary import ALL, Summary, metric_value


@dataclass
class TableData:
    title: str
    header: list[str]
    rows: list[list[str]]
    note: str = ""


def load_label(kind: str, value: float) -> str:
    return LoadPoint(kind, value).label()


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def results_table(summary: Summary) -> TableData:
    header = ["arm", "load", "ok", "errors", "TTFT p50 ms", "TTFT p99 ms", "TPOT mean ms", "TPOT p50 ms",
              "ITL p50 ms", "e2e mean ms", "e2e p50 ms", "e2e p90 ms", "e2e p99 ms", "out tok/s", "req/s",
              "goodput req/s", "acceptance", "mean accept len"]
    rows = [[row.arm, load_label(row.load_kind, row.load_value), *_metric_cells(row.metrics)]
            for row in summary.rows if row.category == ALL]
    return TableData("Results per arm and load point (all categories)", header, rows,
                     "Latencies in milliseconds; ITL is chunk-level (a chunk may carry several tokens).")


def _metric_cells(m: PointMetrics) -> list[str]:
    accepted = m.acceptance
    return [str(m.completed), str(m.errors), ms(m.ttft.p50), ms(m.ttft.p99), ms(m.tpot.mean), ms(m.tpot.p50),
            ms(m.itl.p50), ms(m.e2e.mean), ms(m.e2e.p50), ms(m.e2e.p90), ms(m.e2e.p99),
            number(m.output_throughput, 1), number(m.request_throughput, 3), number(m.goodput, 3),
            "unknown" if accepted is None or accepted.rate is None else f"{accepted.rate:.1%}",
            "unknown" if accepted is None or accepted.mean_length is None else f"{accepted.mean_length:.2f}"]


def speedup_table(summary: Summary, recommendation: Recommendation) -> TableData:
    metric = recommendation.metric
    level = (summary.run.get("criteria") or {}).get("confidence") or 0.95
    header = ["arm", "load", "paired", f"{metric} speedup", "e2e mean speedup", "output throughput ratio",
              "verdict"]
    rows = []
    for verdict in recommendation.verdicts:
        for load in sorted(verdict.speedup):
            row = summary.row(verdict.arm, verdict.load_kind, load)
            rows.append([verdict.arm, load_label(verdict.load_kind, load),
                         "-" if row.paired is None else str(row.paired),
                         with_interval(verdict.speedup[load], row.intervals.get(metric)),
                         with_interval(row.speedup.get("e2e_mean"), row.intervals.get("e2e_mean")),
                         with_interval(verdict.throughput_ratio[load], row.intervals.get("output_throughput")),
                         verdict_cell(verdict, load)])
    note = (f"Against {summary.baseline}, over the requests both arms completed (paired), with {level:.0%} "
            f"paired-bootstrap intervals in brackets. Pays = the interval of {metric} clears "
            f"{1 + recommendation.margin:.2f}x and that of output throughput clears "
            f"{recommendation.throughput_floor:.0%}; loses = an upper bound below 1.00x (or below the "
            "throughput floor); otherwise can't tell at this sample size.")
    return TableData("Speedup against no speculation", header, rows, note)


def with_interval(value: float | None, interval: list[float] | None) -> str:
    """`1.32x [1.10, 1.55]`; the bare ratio where there is no interval."""
    if value is None:
        return "-"
    if not interval or interval[0] == interval[1]:
        return f"{value:.2f}x"
    return f"{value:.2f}x [{interval[0]:.2f}, {interval[1]:.2f}]"


def verdict_cell(verdict, load: float) -> str:
    call = verdict.calls.get(load, "-")
    more = verdict.more_requests.get(load)
    return f"{call} ({more.text()})" if more else call


def category_table(summary: Summary, metric: str) -> TableData:
    kinds = summary.load_kinds()
    loads = [(kind, value) for kind in kinds for value in summary.load_values(kind)]
    header = ["arm", "category"] + [f"{load_label(*load)}" for load in loads]
    rows = []
    for arm in summary.arms:
        for category in summary.categories():
            cells = []
            for kind, value in loads:
                row = summary.row(arm["name"], kind, value, category)
                cells.append(_category_cell(row, metric, summary.baseline == arm["name"]))
            if any(cell != "-" for cell in cells):
                rows.append([arm["name"], category, *cells])
    return TableData(f"{metric} per category (ms; speedup against {summary.baseline} in brackets)",
                     header, rows, "Paired speedups; intervals where a category has at least 5 paired requests.")


def _category_cell(row, metric: str, is_baseline: bool) -> str:
    if row is None or metric_value(row.metrics, metric) is None:
        return "-"
    text = ms(metric_value(row.metrics, metric))
    speed = None if is_baseline else row.speedup.get(metric)
    return text if speed is None else f"{text} ({with_interval(speed, row.intervals.get(metric))})"


def acceptance_table(summary: Summary) -> TableData:
    header = ["arm", "category", "load", "acceptance rate", "mean acceptance length", "drafts", "source"]
    rows = []
    for row in summary.rows:
        accepted = row.metrics.acceptance
        if accepted is None:
            continue
        rows.append([row.arm, row.category, load_label(row.load_kind, row.load_value),
                     "-" if accepted.rate is None else f"{accepted.rate:.1%}",
                     number(accepted.mean_length), "-" if accepted.drafts is None else f"{accepted.drafts:g}",
                     accepted.source])
    note = ("acceptance rate = accepted / drafted tokens; mean acceptance length = 1 + accepted / drafts "
            "(bonus token included); both from summed counters.")
    return TableData("Acceptance", header, rows, note)


def errors_table(summary: Summary) -> TableData:
    rows = [[row.arm, load_label(row.load_kind, row.load_value), str(count), kind]
            for row in summary.rows if row.category == ALL
            for kind, count in row.metrics.error_kinds.items()]
    return TableData("Errors", ["arm", "load", "count", "error"], rows)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
