"""Published GPU sweeps of speculative decoding against the calculators' predictions.

    python benchmarks/published_sweeps.py                      # the table, the medians, the coverage
    python benchmarks/published_sweeps.py --markdown            # the same as markdown (docs/published_sweeps.md)
    python benchmarks/published_sweeps.py --overhead-ms 0,1,2   # other per-pass overheads side by side

Every point of specwise/calc/data/published_sweeps.json is predicted by specwise/sim/published.py with
the catalog's figures and the calculators' defaults (80% of peak bandwidth, 60% of peak FLOP/s), once
per --overhead-ms (a fixed time added to every forward pass; the default is 0, and docs/calculators.md
uses 2 ms for the vLLM blog's setting). Prints, per point, published against predicted with the error
(predicted / published - 1), then the median absolute error over all points and over the held-out
ones, the catalog GPUs and models that no published point checks, and what was recorded but not
predicted. Where others published a fitted step time for a point's GPU and model (the file's
"step_time_fits"), the point is also predicted with that step time in place of the roofline
("step fit" column), and the two step times are printed side by side. Runs in a few seconds on one core;
nothing here is asserted by the tests.
"""

import argparse

import numpy as np

from specwise.calc.catalog import get_gpu, get_model, gpu_names, model_names
from specwise.calc.roofline import RooflineCost
from specwise.sim.published import (deployment_for, load_points, load_step_time_fits, median_abs_error,
                                    not_reproduced, predict_all, predict_with_fits)

STEP_BATCHES = (1, 8, 32, 64)
STEP_TOKENS = (1, 4)
STEP_CONTEXT = 384            # cached tokens per sequence (128-token prompt, half of 512 out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="a published-sweeps JSON file (default: the package's)")
    parser.add_argument("--overhead-ms", default="0,2", help="per-pass overheads to predict with, ms (default 0,2)")
    parser.add_argument("--markdown", action="store_true", help="print markdown tables")
    args = parser.parse_args()
    overheads = [float(value) for value in args.overhead_ms.split(",") if value.strip()]
    points = load_points(args.data)
    runs = {overhead: predict_all(points, overhead) for overhead in overheads}
    fits = load_step_time_fits(args.data)
    with_fits = predict_with_fits(points, fits)

    header = ["series", "GPU", "model", "arm", "load", "published"]
    for overhead in overheads:
        header += [f"pred {overhead:g} ms", "error"]
    header += ["pred step fit", "error", "role"]
    rows = []
    for index, point in enumerate(points):
        load = f"batch {point.load:g}" if point.load_kind == "batch" else f"{point.load:g} req/s"
        row = [point.series, f"{point.tp}x {point.gpu}", point.model, point.arm.split(",")[0], load,
               f"{point.published:.2f}"]
        for overhead in overheads:
            prediction = runs[overhead][index]
            row += [f"{prediction.predicted:.2f}", f"{prediction.error:+.0%}"]
        fitted = with_fits[index]
        row += ["-", "-"] if fitted is None else [f"{fitted.predicted:.2f}", f"{fitted.error:+.0%}"]
        row.append(point.role.replace("_", "-"))
        rows.append(row)
    print_table(header, rows, args.markdown)

    print()
    summary = [["median abs error", "points"] + [f"{overhead:g} ms" for overhead in overheads]
               + ["step fit (points)"]]
    groups = [("all", lambda i: True), ("held out", lambda i: points[i].role == "held_out"),
              ("fit", lambda i: points[i].role == "fit"),
              ("covered by a step-time fit", lambda i: with_fits[i] is not None)]
    groups += [(series, lambda i, s=series: points[i].series == s)
               for series in dict.fromkeys(point.series for point in points)]
    for label, chosen in groups:
        indices = [index for index in range(len(points)) if chosen(index)]
        fitted = [with_fits[index] for index in indices if with_fits[index] is not None]
        summary.append([label, str(len(indices))]
                       + [_percent(median_abs_error([runs[o][index] for index in indices])) for o in overheads]
                       + [f"{_percent(median_abs_error(fitted))} ({len(fitted)})" if fitted else "-"])
    print_table(summary[0], summary[1:], args.markdown)

    for fit in fits:
        print()
        print(f"target step time, ms: roofline (defaults) against {fit.id} ({fit.engine}), "
              f"{fit.tp}x {fit.gpu}, {fit.model}, {STEP_CONTEXT} cached tokens a sequence")
        roofline = RooflineCost(deployment_for(next(p for p in points if fit.covers(p))))
        published = fit.cost()
        rows = []
        for batch in STEP_BATCHES:
            for tokens in STEP_TOKENS:
                context = np.array([batch * STEP_CONTEXT], dtype=float)
                ours = float(roofline.step_times(batch, tokens, context)[0])
                theirs = float(published.step_times(batch, tokens, context)[0])
                rows.append([str(batch), str(tokens), f"{ours * 1e3:.2f}", f"{theirs * 1e3:.2f}",
                             f"{ours / theirs - 1:+.0%}"])
        print_table(["batch", "tokens/seq", "roofline", "published fit", "roofline error"], rows, args.markdown)

    print()
    checked_gpus = {get_gpu(point.gpu).name for point in points}
    checked_models = {get_model(point.model).name for point in points}
    print("catalog GPUs no published point checks: " + ", ".join(n for n in gpu_names() if n not in checked_gpus))
    print("catalog models no published point checks: "
          + ", ".join(n for n in model_names() if n not in checked_models))
    print()
    print("recorded, not predicted:")
    for entry in not_reproduced(args.data):
        print(f"- {entry['citation']}: {entry['published']} ({entry['reason']})")


def _percent(value) -> str:
    return "-" if value is None else f"{value:.1%}"


def print_table(header: list[str], rows: list[list[str]], markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---" for _ in header) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())


if __name__ == "__main__":
    main()
