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

    python benchmarks/step_log_check.py STEPS.jsonl --fit-first N --into profile.json --arm off --output steps.json

--into/--arm/--output: the fit of the first N steps (KV as --kv-reads says) written in place of the arm's fit
in a copy of a calibrate --endpoint profile ("off": the plain server's; a method: its drafting fit), the
request overhead kept from the profile (a step log has no TTFTs): `simulate --validate` replays it, the
model fitted on the steps the server ran during the sweep instead of on what the client saw of them.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specwise.engine.cost.kv_reads import KVReads                                            # noqa: E402
from specwise.engine.cost.linear_cost import LinearStepCost, StepShape  # noqa: E402
from specwise.engine.cost.step_fit import StepSample, fit          # noqa: E402
from specwise.engine.cost.step_profile import load_step_cost                                  # noqa: E402

BATCHES = [(1, 1), (2, 7), (8, 16), (17, 47), (48, 1 << 20)]


def samples(steps: list[dict], reads: KVReads | None) -> list[StepSample]:
    return [StepSample(StepShape.of(s["fed"], s["cached"], reads), s["seconds"], logits_rows=s["sampled"])
            for s in steps]


def table(label: str, cost: LinearStepCost, steps: list[dict]) -> None:
    counted = samples(steps, cost.kv_reads)
    predicted = np.array([float(cost.seconds(s.shape, s.logits_rows)) for s in counted])
    measured = np.array([s.seconds for s in counted])
    error = predicted / measured - 1
    print(f"\n{label}\n  {LinearStepCost.from_json(cost.to_json()).description}")      # its coefficients
    print(f"  all {len(steps)} steps: median |error| {np.median(np.abs(error)):.1%}, total time "
          f"{predicted.sum() / measured.sum() - 1:+.1%}")
    print(f"  {'steps':<22} {'count':>6} {'measured':>10} {'predicted':>10} {'median err':>11} {'time err':>9}")
    batch = np.array([len(s["fed"]) for s in steps])
    decode_only = np.array([s["prompt_tokens"] == 0 for s in steps])
    for kind, mask in (("decodes", decode_only), ("with a prompt chunk", ~decode_only)):
        for low, high in BATCHES:
            chosen = mask & (batch >= low) & (batch <= high)
            if chosen.any():
                span = f"{low}" if low == high else f"{low}-{high}" if high < 1 << 20 else f"{low}+"
                print(f"  {kind + ', batch ' + span:<22} {chosen.sum():>6} {np.median(measured[chosen]) * 1e3:>8.1f}ms "
                      f"{np.median(predicted[chosen]) * 1e3:>8.1f}ms {np.median(error[chosen]):>+11.1%} "
                      f"{predicted[chosen].sum() / measured[chosen].sum() - 1:>+9.1%}")


def write_into(profile: dict, arm: str, cost: LinearStepCost, output: str) -> None:
    """The profile (read from a calibrate --endpoint JSON) with `cost` as the arm's fit, the arm's request
    overhead kept, written to output."""
    linear = profile["linear"]
    held = linear if arm == "off" else linear["drafting"][arm]
    fitted = cost.to_json() | {key: held[key] for key in ("request_overhead_s",) if key in held}
    if arm == "off":
        profile["linear"] = fitted | {key: linear[key] for key in ("drafting",) if key in linear}
    else:
        linear["drafting"][arm] = fitted
    Path(output).write_text(json.dumps(profile, indent=1), encoding="utf-8")
    print(f"wrote {output}: {arm}'s fit from the step log, {LinearStepCost.from_json(fitted).description}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("steps", help="a step log (specwise serve --step-log FILE)")
    parser.add_argument("--profile", help="a profile with a linear fit (calibrate, calibrate --endpoint)")
    parser.add_argument("--fit-first", type=int, help="fit on the log's first N steps, predict the rest")
    parser.add_argument("--since", type=float, default=0.0, help="only steps this many seconds after the first")
    parser.add_argument("--kv-reads", default="16/16", help="the server's reads, for --fit-first (GROUP/BLOCK)")
    parser.add_argument("--into", help="a profile: a copy of it with the --fit-first fit as --arm's goes to --output")
    parser.add_argument("--arm", default="off", help="with --into: off, or the drafting method the log's server ran")
    parser.add_argument("--output", help="with --into: where the copy goes")
    args = parser.parse_args()
    if (args.into is None) != (args.output is None) or (args.into and not args.fit_first):
        parser.error("--into and --output go together, with --fit-first")
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
    if args.into:
        profile = json.loads(Path(args.into).read_text(encoding="utf-8"))
        if args.arm != "off" and args.arm not in profile["linear"].get("drafting", {}):
            parser.error(f"{args.into} has no fit of {args.arm} to replace")
        reads = KVReads.parse(args.kv_reads)
        write_into(profile, args.arm, fit(samples(steps[:args.fit_first], reads), None, reads).cost, args.output)
        return 0
    for reads in (KVReads.parse(args.kv_reads), None):
        fitted = fit(samples(steps[:args.fit_first], reads), None, reads)
        table(f"fitted on the first {args.fit_first} steps, KV read {reads.text() if reads else 'each its own'} "
              f"(residuals: {fitted.summary().rsplit('; ', 1)[-1]})", fitted.cost, held)
    return 0


if __name__ == "__main__":
    sys.exit(main())
