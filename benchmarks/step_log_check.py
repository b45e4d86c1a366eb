"""Hold a step-cost profile against the steps our server actually ran (`specwise serve --step-log FILE`).

    python benchmarks/step_log_check.py STEPS.jsonl --profile profile.json [--since SECONDS]
    python benchmarks/step_log_check.py STEPS.jsonl --fit-first N

A client sees a server's steps only through its streamed chunks; the step log has each one whole
(engine/step_log.py). Per kind of step (decodes only, or decodes beside a prompt chunk) and batch size
it prints the median step measured, the median predicted and the median and total-time error
(predicted / measured - 1). --profile: the profile's linear fit, the KV read as it says. --fit-first N:
the model fitted on the log's first N steps (a calibration sweep run first against the same server,
say), predicting the rest, with the KV counted as --kv-reads says and as if each sequence read its
own cache, side by side. --since: only steps that started that many seconds after the log's first (an
evaluation that followed a sweep).
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specwise.bench.calibrate.logged import logged_samples, residual_table  # noqa: E402
from specwise.engine.cost.kv_reads import KVReads                          # noqa: E402
from specwise.engine.cost.linear_cost import LinearStepCost                # noqa: E402
from specwise.engine.cost.step_fit import fit                              # noqa: E402
from specwise.engine.cost.step_profile import load_step_cost               # noqa: E402


def table(label: str, cost: LinearStepCost, steps: list[dict]) -> None:
    counted = logged_samples(steps, cost.kv_reads)
    predicted = np.array([float(cost.seconds(s.shape, s.logits_rows)) for s in counted])
    measured = np.array([s.seconds for s in counted])
    error = predicted / measured - 1
    print(f"\n{label}\n  {LinearStepCost.from_json(cost.to_json()).description}")      # its coefficients
    print(f"  all {len(steps)} steps: median |error| {np.median(np.abs(error)):.1%}, total time "
          f"{predicted.sum() / measured.sum() - 1:+.1%}")
    print("\n".join(residual_table(cost, steps, counted)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("steps", help="a step log (specwise serve --step-log FILE)")
    parser.add_argument("--profile", help="a profile with a linear fit (calibrate, calibrate --endpoint)")
    parser.add_argument("--fit-first", type=int, help="fit on the log's first N steps, predict the rest")
    parser.add_argument("--since", type=float, default=0.0, help="only steps this many seconds after the first")
    parser.add_argument("--kv-reads", default="16/16", help="the server's reads, for --fit-first (GROUP/BLOCK)")
    args = parser.parse_args()
    steps = [json.loads(line) for line in Path(args.steps).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not steps or (args.profile is None) == (args.fit_first is None):
        parser.error("give a non-empty step log and one of --profile or --fit-first")
    held = steps[args.fit_first or 0:]
    held = [s for s in held if s["start"] - steps[0]["start"] >= args.since]
    if args.profile:
        cost = load_step_cost(args.profile)
        if not isinstance(cost, LinearStepCost):
            parser.error(f"{args.profile} holds no linear fit")
        table(str(args.profile), cost, held)
        return 0
    for reads in (KVReads.parse(args.kv_reads), None):
        fitted = fit(logged_samples(steps[:args.fit_first], reads), None, reads)
        table(f"fitted on the first {args.fit_first} steps, KV read {reads.text() if reads else 'each its own'} "
              f"(residuals: {fitted.summary().rsplit('; ', 1)[-1]})", fitted.cost, held)
    return 0


if __name__ == "__main__":
    sys.exit(main())
