"""`simulate --validate RUN --output DIR`'s plot (DIR/validation.png): what `--validate` prints, to look at.

One column per metric (mean TTFT, mean TPOT, the median step, output throughput, acceptance where an arm
speculates) and two rows per load kind (concurrency, rate, ...). The upper row: each arm in its own colour,
the measurement a solid line with dots, the prediction a dashed line with crosses, over the load points
(times on a log scale: they span 30 ms to seconds). The lower row: the error, predicted / measured - 1, per
arm and point, beside a shaded band of +-5% and dotted lines at +-15% (the bounds docs/calculators.md holds
a replay to); its title gives the median and worst absolute error over the row's points, as the printed
summary does over all of them. Worked example: a step predicted 254 ms where 290 ms was measured is a
cross under a dot in the upper row and a point at -12% in the lower one, inside the dotted lines.
"""

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, PercentFormatter

from specwise.bench.report.plots import png, style_axes
from specwise.sim.validate import Validation

# (key in PointComparison's figures, axis label, scale from the stored unit, log scale)
PANELS = (("ttft", "mean TTFT (ms)", 1e3, True), ("tpot", "mean TPOT (ms)", 1e3, True),
          ("step", "median step (ms)", 1e3, True), ("throughput", "output tokens/s", 1.0, False),
          ("acceptance", "acceptance rate", 1.0, False))
SIDES = (("measured", "-o"), ("predicted", "--x"))
BAND, BOUND = 0.05, 0.15
# a log axis's ticks as 200, 500, 1000 (not 2 x 10^2), only those led by 1, 2 or 5 (not 30, 40, ... crowded)
PLAIN = FuncFormatter(lambda value, _: f"{value:g}" if f"{value:.0e}"[0] in "125" else "")
MARGINS = dict(left=0.05, right=0.99, wspace=0.3, hspace=0.5)


def validation_figure(validation: Validation) -> Figure:
    """The figure (Agg, no display): two rows per load kind, a column per metric, lines by arm and side."""
    kinds = list(dict.fromkeys(p.load_kind for p in validation.points))
    arms = list(dict.fromkeys(p.arm for p in validation.points))
    panels = [panel for panel in PANELS if any(p.measured.get(panel[0]) is not None for p in validation.points)]
    if not kinds or not panels:
        raise ValueError("no point with a measured figure to plot")
    figure = Figure(figsize=(4 * len(panels), 6.4 * len(kinds)))
    rows, columns = 2 * len(kinds), len(panels)
    for row, kind in enumerate(kinds):
        points = sorted((p for p in validation.points if p.load_kind == kind), key=lambda p: p.load_value)
        loads = list(dict.fromkeys(p.load_value for p in points))
        for column, (key, label, scale, log) in enumerate(panels):
            values = figure.add_subplot(rows, columns, 2 * row * columns + column + 1)
            errors = figure.add_subplot(rows, columns, (2 * row + 1) * columns + column + 1, sharex=values)
            for colour, arm in enumerate(arms):
                mine = [p for p in points if p.arm == arm]
                for side, style in SIDES:
                    xy = [(p.load_value, getattr(p, side)[key] * scale) for p in mine
                          if getattr(p, side).get(key) is not None]
                    if xy:
                        values.plot(*zip(*xy), style, color=f"C{colour}", label=f"{arm} {side}")
                xy = [(p.load_value, error) for p in mine if (error := p.error(key)) is not None]
                if xy:
                    errors.plot(*zip(*xy), "-o", color=f"C{colour}", label=arm)
            if log:
                values.set_yscale("log")
                for axis in (values.yaxis.set_major_formatter, values.yaxis.set_minor_formatter):
                    axis(PLAIN)
            style_axes(values, kind, label, loads, legend=row == 0 and column == 0)
            errors.axhspan(-BAND, BAND, color="0.85", zorder=0)
            for bound in (-BOUND, BOUND):
                errors.axhline(bound, color="0.5", linestyle=":", linewidth=1)
            errors.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
            if figures := validation.error_summary(key, kind):
                median, worst, count = figures
                errors.set_title(f"|error| median {median:.1%}, worst {worst:.1%} ({count} points)", fontsize="small")
            style_axes(errors, kind, f"{label.split(' (')[0]}: error", loads, legend=False)
    return figure


def validation_png(validation: Validation) -> bytes:
    rows = 2 * len({p.load_kind for p in validation.points})
    return png(validation_figure(validation), MARGINS | dict(bottom=0.16 / rows, top=1 - 0.1 / rows))
