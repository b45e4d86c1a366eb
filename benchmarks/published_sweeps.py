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
predicted. Runs in a few seconds on one core; nothing here is asserted by the tests.
"""

import argparse

from specwise.calc.catalog import get_gpu, get_model, gpu_names, model_names
from specwise.sim.published import load_points, median_abs_error, not_reproduced, predict_all


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="a published-sweeps JSON file (default: the package's)")
    parser.add_argument("--overhead-ms", default="0,2", help="per-pass overheads to predict with, ms (default 0,2)")
    parser.add_argument("--markdown", action="store_true", help="print markdown tables")
    args = parser.parse_args()
    overheads = [float(value) for value in args.overhead_ms.split(",") if value.strip()]
    points = load_points(args.data)
    runs = {overhead: predict_all(points, overhead) for overhead in overheads}

    header = ["series", "GPU", "model", "arm", "load", "published"]
    for overhead in overheads:
        header += [f"pred {overhead:g} ms", "error"]
    header.append("role")
    rows = []
    for index, point in enumerate(points):
        load = f"batch {point.load:g}" if point.load_kind == "batch" else f"{point.load:g} req/s"
        row = [point.series, f"{point.tp}x {point.gpu}", point.model, point.arm.split(",")[0], load,
               f"{point.published:.2f}"]
        for overhead in overheads:
            prediction = runs[overhead][index]
            row += [f"{prediction.predicted:.2f}", f"{prediction.error:+.0%}"]
        row.append(point.role.replace("_", "-"))
        rows.append(row)
    print_table(header, rows, args.markdown)

    print()
    summary = [["median abs error", "points"] + [f"{overhead:g} ms" for overhead in overheads]]
    for label, role in (("all", None), ("held out", "held_out"), ("fit", "fit")):
        count = sum(1 for point in points if role is None or point.role == role)
        summary.append([label, str(count)] + [_percent(median_abs_error(runs[o], role)) for o in overheads])
    for series in dict.fromkeys(point.series for point in points):
        chosen = {o: [p for p in runs[o] if p.point.series == series] for o in overheads}
        summary.append([series, str(len(chosen[overheads[0]]))]
                       + [_percent(median_abs_error(chosen[o])) for o in overheads])
    print_table(summary[0], summary[1:], args.markdown)

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
