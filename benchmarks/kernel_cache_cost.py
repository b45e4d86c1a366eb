"""What `specwise serve`'s bound on the CPU kernel caches costs: steps whose shape fell out of the cache.

`specwise serve` holds oneDNN's primitive cache and ideep's LRU cache to 128 entries each
(specwise/models/kernel_caches.py) instead of their 1,024, because a flat step's token count keeps
taking new values and every new one added ~2.2 MiB of live heap. The price: a token count that
fell out of the cache has its kernels built again when it comes back. This measures that price on
the worst case, steps that cycle through more token counts than the bound holds, so that every one
misses under the bound and hits under the default:

  - one engine per child process (the capacities are read when the first kernel runs), the default
    model, greedy, one prompt at a time with max_tokens 1: each request is one prefill step of
    exactly its prompt's token count (prompt token ids, no chat template);
  - pass 1 over --lengths distinct token counts builds every kernel (both settings miss); passes 2
    and later are timed: under the default capacities they hit, under the bound they miss again
    (least recently used, cycled through);
  - the settings alternate, child by child, --rounds times (this machine's speed drifts: compare
    within a round), and the median step of the timed passes is printed per setting, with the
    bound's extra milliseconds a step and its ratio to the default's;
  - then one more child per setting with ONEDNN_VERBOSE=all counts the primitives oneDNN built
    (`create:cache_miss`) in the timed passes, per step: a count the machine's load cannot move.
    (ideep's own cache prints nothing; its misses show in the timing only.)

Time it on a quiet machine: with two busy servers beside it on 2 cores, the same child's step
took 0.22 s or 1.4 s from one run to the next (OpenMP threads waiting on descheduled ones).

    python benchmarks/kernel_cache_cost.py                          # 128 against 1024, 48 token counts
    python benchmarks/kernel_cache_cost.py --entries 16,128,1024 --dtype float32
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PASS_MARK = "kernel_cache_cost pass"
sys.path.insert(0, str(ROOT))

from specwise.models.kernel_caches import CACHE_VARIABLES  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", default="128,1024", help="cache capacities to compare, comma-separated")
    parser.add_argument("--lengths", type=int, default=48, help="distinct token counts a pass cycles through")
    parser.add_argument("--first-length", type=int, default=17)
    parser.add_argument("--stride", type=int, default=7, help="token counts first, first + stride, ...")
    parser.add_argument("--passes", type=int, default=3, help="passes over the token counts (the first untimed)")
    parser.add_argument("--rounds", type=int, default=3, help="children per setting, alternating")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def child(args) -> None:
    """One engine, the caches at the capacity the parent set: per pass, each token count's step seconds."""
    from specwise.engine.llm import LLM
    from specwise.models.checkpoints.default_model import default_model_path
    from specwise.sampling_params import SamplingParams

    llm = LLM(model=str(default_model_path()), dtype=args.dtype, compile=False)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    vocab_ids = llm.tokenizer.encode("The history of the printing press begins in the fifteenth century. " * 80)
    lengths = [args.first_length + i * args.stride for i in range(args.lengths)]
    if lengths[-1] > len(vocab_ids):
        raise SystemExit(f"token counts up to {lengths[-1]} need a longer text than {len(vocab_ids)} tokens")
    passes = []
    for index in range(args.passes):
        print(f"{PASS_MARK} {index}", flush=True)           # splits ONEDNN_VERBOSE's lines by pass
        seconds = []
        for length in lengths:
            started = time.perf_counter()
            llm.generate(vocab_ids[:length], params)
            seconds.append(time.perf_counter() - started)
        passes.append(seconds)
    print(json.dumps({"lengths": lengths, "passes": passes}))


def run_child(args, entries: int, verbose: bool = False) -> dict:
    """The child's result; with verbose, "misses": oneDNN primitives built in each pass."""
    env = dict(os.environ, **{name: str(entries) for name in CACHE_VARIABLES})
    if verbose:
        env["ONEDNN_VERBOSE"] = "all"
    command = [sys.executable, __file__, "--child", "--lengths", str(args.lengths),
               "--first-length", str(args.first_length), "--stride", str(args.stride),
               "--passes", str(args.passes), "--dtype", args.dtype]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"child with {entries} entries failed ({done.returncode}): {done.stderr[-2000:]}")
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    if verbose:
        result["misses"] = []
        for line in lines:
            if line.startswith(PASS_MARK):
                result["misses"].append(0)
            elif "create:cache_miss" in line and result["misses"]:
                result["misses"][-1] += 1
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args)
        return 0
    if args.passes < 2:
        raise SystemExit("--passes must be at least 2 (the first builds the kernels and is not timed)")
    settings = [int(value) for value in args.entries.split(",")]
    print(f"{args.lengths} token counts {args.first_length}..{args.first_length + (args.lengths - 1) * args.stride}, "
          f"{args.passes} passes (the first untimed), dtype {args.dtype}, load {os.getloadavg()[0]:.2f}")
    rows = {entries: [] for entries in settings}
    for round_index in range(args.rounds):
        line = []
        for entries in settings:
            result = run_child(args, entries)
            timed = [s for seconds in result["passes"][1:] for s in seconds]
            first = statistics.median(result["passes"][0])
            rows[entries].append((statistics.median(timed), first))
            line.append(f"{entries} entries: step {statistics.median(timed) * 1e3:.2f} ms (first pass {first * 1e3:.2f})")
        print(f"round {round_index + 1} (load {os.getloadavg()[0]:.2f}): " + "; ".join(line), flush=True)
    reference = max(settings)
    print(f"\nmedian over rounds of each round's median step, and against {reference} entries in the same round:")
    for entries in settings:
        steps = [step for step, _ in rows[entries]]
        ratios = [step / rows[reference][i][0] for i, step in enumerate(steps)]
        extra = [(step - rows[reference][i][0]) * 1e3 for i, step in enumerate(steps)]
        print(f"  {entries:5d} entries: {statistics.median(steps) * 1e3:8.2f} ms a step, "
              f"{statistics.median(extra):+7.2f} ms ({statistics.median(ratios):.3f}x; rounds "
              f"{', '.join(f'{r:.3f}' for r in ratios)})")
    print("\noneDNN primitives built (ONEDNN_VERBOSE=all), per step of the timed passes:")
    for entries in settings:
        misses = run_child(args, entries, verbose=True)["misses"]
        print(f"  {entries:5d} entries: {sum(misses[1:]) / (len(misses[1:]) * args.lengths):.1f} "
              f"(first pass: {misses[0] / args.lengths:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
