"""Two results directories of one run's load points, side by side: per arm and point the mean TTFT,
mean TPOT, median step, output throughput, acceptance and verdict of each, the error (second / first
- 1), then per metric the median and worst absolute error. `specwise simulate --validate MEASURED`
prints this for a measurement and its replay itself (sim/validate.py `compare` and `report`, which
this script calls); this is for two runs that are not one the other's replay.

    python benchmarks/validate_simulator.py FIRST SECOND [--labels meas,sim]

Two calibrations of one server, a minute apart (benchmarks/calibrate_validate.sh runs CALIBRATIONS
sweeps back to back and replays one evaluation with each profile), held against each other:

    python benchmarks/validate_simulator.py OUT/predicted-1 OUT/predicted-2 --labels sw1,sw2

says how far apart the two sweeps put their predictions of the same requests. That is the machine's
drift between two sweeps, not the model's error, and no prediction from one sweep can be expected
closer to the measurement than the two sweeps are to each other. A measured run against a
simulation of it (`specwise simulate` with the same arms, loads and workload, the way the V0
scheduler was checked) compares the same way.
"""

import argparse

from specwise.bench.results import read_records, read_run_info
from specwise.sim.validate import Validation, compare, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", help="results directory (evaluate, simulate or simulate --validate --output)")
    parser.add_argument("second", help="results directory of the same arms and load points")
    parser.add_argument("--labels", default="meas,sim", help="the two sides' column heads (default meas,sim)")
    args = parser.parse_args()
    labels = tuple(args.labels.split(","))
    if len(labels) != 2 or not all(labels):
        parser.error("--labels takes two names, e.g. meas,sim")
    first, second = ([r for r in read_records(path) if not r.warmup] for path in (args.first, args.second))
    points = compare(first, second, read_run_info(args.first))
    print(f"{args.second} against {args.first}; error = {labels[1]} / {labels[0]} - 1")
    print(report(Validation(points), labels, decided_by=labels[0]))


if __name__ == "__main__":
    main()
