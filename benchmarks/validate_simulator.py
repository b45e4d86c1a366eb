"""Simulated against measured: TPOT and output throughput per arm and load point.

For the flat model, `specwise simulate --validate MEASURED --profile profile.json` replays a
measured run request for request and prints the errors itself. This script compares any two
results directories with the same arms and loads; the commands below are how the V0 model
(`--scheduler v0`) was checked before the flat model existed.

    specwise evaluate --methods off,ngram --concurrency 1,2,4,8,16,32,64 --per-category 2 \
        --max-tokens 32 --duration 20 --output measured
    specwise calibrate --output profile.json
    specwise simulate --model smollm2-135m --profile profile.json --workload suite --per-category 2 \
        --max-tokens 32 --duration 20 --concurrency 1,2,4,8,16,32,64 \
        --arm ngram:k=4,from=measured,arm=ngram-k4,name=ngram-k4 \
        --max-num-seqs 64 --max-num-batched-tokens 4096 --kv-cache-tokens 23296 --scheduler v0 --output simulated
    python benchmarks/validate_simulator.py measured simulated

The simulation gets the evaluation's flags (workload, lengths, duration, the engine's batch
limits and KV cache: 1 GiB of fp32 KV is 23,296 tokens of SmolLM2-135M). Prints, per arm and
load point, the figures and the relative error (simulated / measured - 1), then the median
absolute error per metric. The issue's target: at most 15% on TPOT and on output throughput.
Acceptance (accepted / drafted) is shown as a check of the drafting model, not a target.
"""

import argparse
import statistics

from specwise.bench.results import read_records, read_run_info
from specwise.bench.report.summary import ALL, summarize

METRICS = (("TPOT mean", lambda m: m.tpot.mean), ("output tok/s", lambda m: m.output_throughput),
           ("acceptance", lambda m: m.acceptance.rate if m.acceptance else None))


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
