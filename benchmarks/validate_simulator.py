"""Simulated against measured: TPOT and output throughput per arm and load point.

    specwise evaluate --quick --output measured
    specwise calibrate --output profile.json ...
    specwise simulate --profile profile.json --arm off --arm ngram:from=measured,arm=ngram-k4 ... --output simulated
    python benchmarks/validate_simulator.py measured simulated

Prints, per arm and load point, both figures and the relative error (simulated / measured - 1),
then the median absolute error per metric. The issue's target: at most 15% on both.
"""

import argparse
import statistics

from specwise.bench.results import read_records, read_run_info
from specwise.bench.summary import ALL, summarize

METRICS = (("TPOT mean", lambda m: m.tpot.mean), ("output tok/s", lambda m: m.output_throughput))


def load(results_dir: str):
    return summarize(read_records(results_dir), read_run_info(results_dir))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("measured", help="evaluate results directory")
    parser.add_argument("simulated", help="simulate results directory (same arms, loads and workload)")
    args = parser.parse_args()
    measured, simulated = load(args.measured), load(args.simulated)
    errors = {name: [] for name, _ in METRICS}
    print(f"{'arm':<12} {'load':>6}  " + "  ".join(f"{name:>12} meas {'sim':>8} {'err':>6}" for name, _ in METRICS))
    for row in measured.rows:
        if row.category != ALL:
            continue
        twin = simulated.row(row.arm, row.load_kind, row.load_value)
        if twin is None:
            continue
        cells = []
        for name, read in METRICS:
            real, model = read(row.metrics), read(twin.metrics)
            error = None if not real or model is None else model / real - 1
            if error is not None:
                errors[name].append(abs(error))
            cells.append(f"{_fmt(real):>17} {_fmt(model):>8} {_pct(error):>6}")
        print(f"{row.arm:<12} {row.load_value:>6g}  " + "  ".join(cells))
    for name, values in errors.items():
        if values:
            print(f"median |error| {name}: {statistics.median(values):.1%} over {len(values)} points")


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3g}"


def _pct(value) -> str:
    return "-" if value is None else f"{value:+.0%}"


if __name__ == "__main__":
    main()
