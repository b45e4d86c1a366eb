"""Report plots as PNG bytes (matplotlib's Agg canvas; no pyplot, no display needed)."""

import io

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

from specwise.bench.report.recommend import Recommendation
from specwise.bench.report.summary import ALL, Summary, metric_value

ONE_ROW = dict(left=0.08, right=0.98, bottom=0.14, top=0.95, wspace=0.25)
X_LABELS = {"concurrency": "concurrency (requests in flight)", "rate": "request rate (req/s)",
            "trace": "trace replay speed"}


def latency_plot(summary: Summary, kind: str, metric: str) -> bytes:
    figure = Figure(figsize=(10, 4))
    for index, key in enumerate((metric, "e2e_p50")):
        axes = figure.add_subplot(1, 2, index + 1)
        for arm, xs, ys in _series(summary, kind, lambda m, k=key: metric_value(m, k)):
            axes.plot(xs, [y * 1000 for y in ys], marker="o", label=arm)
        style_axes(axes, kind, f"{key} (ms)", summary.load_values(kind))
    return png(figure)


def throughput_plot(summary: Summary, kind: str) -> bytes:
    figure = Figure(figsize=(10, 4))
    for index, key in enumerate(("output_throughput", "request_throughput")):
        axes = figure.add_subplot(1, 2, index + 1)
        for arm, xs, ys in _series(summary, kind, lambda m, k=key: metric_value(m, k)):
            axes.plot(xs, ys, marker="o", label=arm)
        style_axes(axes, kind, "output tokens/s" if index == 0 else "requests/s", summary.load_values(kind))
    return png(figure)


def speedup_plot(summary: Summary, recommendation: Recommendation, kind: str) -> bytes:
    figure = Figure(figsize=(10, 4))
    axes = figure.add_subplot(1, 1, 1)
    for verdict in recommendation.verdicts:
        if verdict.load_kind != kind:
            continue
        points = sorted((x, y) for x, y in verdict.speedup.items() if y is not None)
        if points:
            xs, ys = [x for x, _ in points], [y for _, y in points]
            bounds = [verdict.intervals.get(x) or [y, y] for x, y in points]
            errors = [[y - lo for y, (lo, _) in zip(ys, bounds)], [hi - y for y, (_, hi) in zip(ys, bounds)]]
            axes.errorbar(xs, ys, yerr=errors, marker="o", capsize=4, label=verdict.arm)
        if verdict.crossover is not None:
            axes.axvline(verdict.crossover, linestyle=":", color="grey")
    axes.axhline(1.0, color="black", linewidth=1, label="break-even")
    axes.axhline(1.0 + recommendation.margin, color="green", linestyle="--", linewidth=1,
                 label=f"pays (+{recommendation.margin:.0%})")
    style_axes(axes, kind, f"speedup in {recommendation.metric} vs {summary.baseline} (error bars: interval)",
               summary.load_values(kind))
    return png(figure)


def acceptance_plot(summary: Summary) -> bytes | None:
    """Acceptance rate per category and arm, counters summed over load points."""
    rates: dict[str, dict[str, float]] = {}
    for arm in summary.arms:
        for category in summary.categories():
            rate = _pooled_rate([r for r in summary.rows if r.arm == arm["name"] and r.category == category])
            if rate is not None:
                rates.setdefault(arm["name"], {})[category] = rate
    if not rates:
        return None
    categories = summary.categories()
    figure = Figure(figsize=(10, 4))
    axes = figure.add_subplot(1, 1, 1)
    width = 0.8 / len(rates)
    for index, (arm, by_category) in enumerate(rates.items()):
        xs = [position + index * width for position in range(len(categories))]
        axes.bar(xs, [by_category.get(c, 0.0) for c in categories], width=width, label=arm)
    axes.set_xticks([position + 0.4 - width / 2 for position in range(len(categories))], categories)
    axes.set_ylabel("acceptance rate")
    axes.set_ylim(0, 1)
    axes.legend(fontsize="small")
    axes.grid(True, axis="y", alpha=0.3)
    return png(figure)


def _pooled_rate(rows) -> float | None:
    counted = [r.metrics.acceptance for r in rows if r.metrics.acceptance and r.metrics.acceptance.draft_tokens]
    drafted = sum(a.draft_tokens for a in counted)
    return sum(a.accepted_tokens for a in counted) / drafted if drafted else None


def _series(summary: Summary, kind: str, value):
    for arm in summary.arms:
        points = []
        for load in summary.load_values(kind):
            row = summary.row(arm["name"], kind, load, ALL)
            y = value(row.metrics) if row else None
            if y is not None:
                points.append((load, y))
        if points:
            yield arm["name"], [x for x, _ in points], [y for _, y in points]


def style_axes(axes, kind: str, ylabel: str, loads=(), legend: bool = True) -> None:
    if kind == "concurrency":
        axes.set_xscale("log", base=2)
        axes.xaxis.set_major_formatter(ScalarFormatter())
        if loads:
            axes.set_xticks(list(loads))
    axes.set_xlabel(X_LABELS.get(kind, kind))
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    if legend:
        axes.legend(fontsize="small")


def png(figure: Figure, margins: dict | None = None) -> bytes:
    """The figure as PNG bytes, laid out by margins (Figure.subplots_adjust's; default: one row of panels)."""
    FigureCanvasAgg(figure)
    figure.subplots_adjust(**(margins or ONE_ROW))          # set once, not fitted (tight_layout draws twice)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()
