"""Lookahead decoding against prompt lookup (ngram) and no speculation, per suite category, and
what a step with the lookahead branch costs against a plain step at batch 1, 4 and 16.

Terms: an **arm** is off, ngram (k = --k) or lookahead:W,N,G, each with its own engine
(the same weights, loaded once). A **repeat** serves --per-category requests of one category one
at a time (concurrency 1), greedy, capped at --max-tokens, in every arm; the arms' engines take
steps in turn (the order rotated each round) and each step is timed alone, so a change in a
shared machine's speed hits every arm alike. Greedy output is lossless, so every arm generates
the same tokens in float32 (in bfloat16 a different batch shape can flip a near-tie and the
texts part; the script notes it); **speedup** = the arm's output tokens/s over the repeat
(prefill included, as a user sees it) / off's; the median over repeats is printed with the
range, and acceptance (docs/design.md definitions: for lookahead, drafted = the length of the
candidate the accepted path followed) and mean acceptance length from the engine's counters.

Step cost: the target's forward (logits included) over a batch of B sequences at context
--context, each feeding 1 token (plain), 1 + k tokens (an ngram chain) or its last token plus a
full lookahead tree ((W + G)(N - 1) + max(0, k - (N - 1)) rows: prompt lookup's candidate of k
tokens, G - 1 more of N - 1 and the W x (N - 1) window; k = --k), timed interleaved,
median of --step-repeats. A lookahead step pays while the
tokens it emits per step (1 + accepted, measured above) exceed its cost ratio to a plain step.

    python benchmarks/lookahead_speedup.py                                  # default model, 1 thread
    python benchmarks/lookahead_speedup.py --configs 4,3,4/2,4,2 --categories chat,math --repeats 3
    python benchmarks/lookahead_speedup.py --steps-only
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specwise.bench.inputs.suite import load_suite  # noqa: E402
from specwise.config import EngineConfig  # noqa: E402
from specwise.engine.llm import LLM  # noqa: E402
from specwise.engine.llm_engine import LLMEngine  # noqa: E402
from specwise.engine.spec_decode.draft_tree import DraftTree  # noqa: E402
from specwise.engine.spec_decode.lookahead import window_rows  # noqa: E402
from specwise.engine.spec_decode.metrics import SpecStats  # noqa: E402
from specwise.models.capabilities import compute_dtype  # noqa: E402
from specwise.models.checkpoints.loader import load_checkpoint  # noqa: E402
from specwise.sampling_params import SamplingParams  # noqa: E402

DEFAULT_CATEGORIES = "chat,math,translation,code_editing,summarization,extraction"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="target (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--categories", default=DEFAULT_CATEGORIES)
    parser.add_argument("--per-category", type=int, default=3, help="requests per category and pass (default 3)")
    parser.add_argument("--max-tokens", type=int, default=96, help="cap on output tokens per request (default 96)")
    parser.add_argument("--configs", default="2,3,2/1,3,2/0,3,2",
                        help="lookahead W,N,G sizes, '/'-separated (default 2,3,2/1,3,2/0,3,2)")
    parser.add_argument("--k", type=int, default=4,
                        help="k of every arm: ngram's drafts, lookahead's prompt-lookup candidate (default 4)")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repeats (default 2)")
    parser.add_argument("--num-threads", type=int, default=1, help="torch threads (default 1: a shared machine)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--batch-sizes", default="1,4,16", help="step cost at these batch sizes (default 1,4,16)")
    parser.add_argument("--context", type=int, default=300, help="cached tokens per sequence for step cost")
    parser.add_argument("--step-repeats", type=int, default=5)
    parser.add_argument("--steps-only", action="store_true", help="only the step cost")
    parser.add_argument("--json", default=None, help="also write the figures here")
    return parser.parse_args(argv)


class ArmEngine:
    """One arm: its own engine (the same weights), serving a category's requests one at a time."""

    def __init__(self, arm: str, checkpoint, args):
        self.arm = arm
        # a small KV cache each (one sequence at a time): several engines at the default 1 GiB each ran a
        # 23 GB machine out of memory
        self.engine = LLMEngine(EngineConfig(dtype=args.dtype, num_threads=args.num_threads, max_model_len=2048,
                                             kv_cache_gb=0.125, speculative=None if arm == "off" else arm,
                                             num_speculative_tokens=args.k), checkpoint)
        self.queue, self.seconds, self.tokens, self.stats = [], 0.0, 0, SpecStats()

    def start(self, items, max_tokens: int) -> None:
        self.queue = [(item.messages or item.prompt, SamplingParams(temperature=0, max_tokens=min(item.max_tokens,
                                                                                                  max_tokens)))
                      for item in items]
        self.seconds, self.tokens, self.stats = 0.0, 0, SpecStats()
        self._next()

    def _next(self) -> None:
        if self.queue:
            prompt, params = self.queue.pop(0)
            self.engine.add_request(prompt, params)

    @property
    def busy(self) -> bool:
        return self.engine.has_unfinished()

    def step(self) -> None:
        """One engine step, timed; a finished request makes room for the next (concurrency 1)."""
        started = time.perf_counter()
        outputs = self.engine.step()
        self.seconds += time.perf_counter() - started
        for output in outputs:
            if output.finished:
                self.tokens += len(output.output_token_ids)
                self.stats = self.stats.merge(output.spec)
                self._next()


def speedups(arms: list[ArmEngine], category: str, args) -> dict:
    """Every arm serves the same requests; their engines take steps in turn (the order rotated each
    round), each step timed alone, so a change in the machine's speed hits every arm alike."""
    items = load_suite([category])[:args.per_category]
    seconds = {arm.arm: [] for arm in arms}
    tokens = {arm.arm: [] for arm in arms}
    stats = {arm.arm: SpecStats() for arm in arms}
    for repeat in range(args.repeats):
        for arm in arms:
            arm.start(items, args.max_tokens)
        rounds = 0
        while any(arm.busy for arm in arms):
            shift = rounds % len(arms)
            for arm in arms[shift:] + arms[:shift]:
                if arm.busy:
                    arm.step()
            rounds += 1
        for arm in arms:
            seconds[arm.arm].append(arm.seconds)
            tokens[arm.arm].append(arm.tokens)
            stats[arm.arm] = stats[arm.arm].merge(arm.stats)
        print(f"  {category} repeat {repeat}: " + ", ".join(
            f"{arm.arm} {arm.tokens / arm.seconds:.1f} tok/s" for arm in arms), file=sys.stderr, flush=True)
    rows = {}
    for name in seconds:
        if tokens[name] != tokens["off"]:
            # fp32 is token-identical (tests); in bf16 a different batch shape can flip a near-tie argmax
            print(f"  note: {name} emitted {tokens[name]} tokens, off {tokens['off']} (bf16 near-ties?)",
                  file=sys.stderr)
        ratios = [(count / mine) / (off_count / off) for count, mine, off_count, off
                  in zip(tokens[name], seconds[name], tokens["off"], seconds["off"])]
        rows[name] = {"tokens_per_s": sum(tokens[name]) / sum(seconds[name]), "speedup": statistics.median(ratios),
                      "speedup_min": min(ratios), "speedup_max": max(ratios),
                      "acceptance_rate": stats[name].acceptance_rate,
                      "mean_acceptance_length": stats[name].mean_acceptance_length, "drafts": stats[name].drafts}
    return rows


def lookahead_tree(window: int, ngram: int, candidates: int, k: int) -> DraftTree:
    """A full step's tree: prompt lookup's candidate of max(k, N - 1) tokens and G - 1 more of N - 1, with
    distinct first tokens, and the Jacobi window: (W + G)(N - 1) + max(0, k - (N - 1)) rows."""
    depth = ngram - 1
    lengths = [max(k, depth)] + [depth] * (candidates - 1)
    tree = DraftTree.from_candidates([[100 + g] + [200 + j for j in range(length - 1)]
                                      for g, length in enumerate(lengths)])
    offsets, sees = window_rows(window, depth)
    return tree.with_free_rows([300 + r for r in range(window * depth)], offsets, sees)


def step_costs(llm: LLM, configs: list[tuple[int, int, int]], args) -> dict:
    """{batch: {shape: seconds}}: plain, ngram chain 1 + k, and each lookahead config, timed interleaved."""
    runner = llm.engine.runner
    shapes = {"plain": None, f"ngram k={args.k}": args.k}
    shapes.update({f"lookahead:{w},{n},{g}": lookahead_tree(w, n, g, args.k) for w, n, g in configs})
    results = {}
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        times = {name: [] for name in shapes}
        for repeat in range(args.step_repeats + 1):
            for name, shape in shapes.items():
                if isinstance(shape, DraftTree):
                    runs, trees, num_logits = [[1] + shape.token_ids] * batch, [shape] * batch, 1 + shape.num_rows
                else:
                    rows = 1 + (shape or 0)
                    runs, trees, num_logits = [[1] * rows] * batch, None, rows
                blocks = runner.blocks_for(args.context + len(runs[0]))
                tables = [[(row * blocks + index) % runner.num_blocks for index in range(blocks)]
                          for row in range(batch)]
                started = time.perf_counter()
                runner.forward(runs, [args.context] * batch, tables, [num_logits] * batch, trees=trees)
                if repeat:                               # the first round warms up
                    times[name].append(time.perf_counter() - started)
        results[batch] = {name: statistics.median(values) for name, values in times.items()}
        plain = results[batch]["plain"]
        print(f"batch {batch:3d}: " + "  ".join(f"{name} {seconds * 1e3:.1f} ms ({seconds / plain:.2f}x)"
                                                for name, seconds in results[batch].items()), flush=True)
    return results


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.num_threads)
    checkpoint = load_checkpoint(args.model, compute_dtype(args.dtype, "cpu"))
    configs = [tuple(int(value) for value in text.split(",")) for text in args.configs.split("/") if text]
    names = ["off", "ngram"] + [f"lookahead:{w},{n},{g}" for w, n, g in configs]
    print(f"model {args.model or 'SmolLM2-135M-Instruct (default)'}, "
          f"dtype {compute_dtype(args.dtype, 'cpu')}, {args.num_threads} thread(s)", flush=True)
    figures = {"args": vars(args)}
    if not args.steps_only:
        arms = [ArmEngine(name, checkpoint, args) for name in names]
        for arm in arms:                                   # warm-up
            arm.engine.add_request("warm-up", SamplingParams(temperature=0, max_tokens=8))
            while arm.busy:
                arm.engine.step()
        figures["categories"] = {}
        for category in args.categories.split(","):
            rows = speedups(arms, category, args)
            figures["categories"][category] = rows
            print(f"\n{category} (concurrency 1, greedy, median of {args.repeats} repeats, steps interleaved)")
            print(f"  {'arm':20s} {'tok/s':>7s} {'speedup':>8s} {'range':>13s} {'accept':>7s} {'mean len':>8s}")
            for arm, row in rows.items():
                print(f"  {arm:20s} {row['tokens_per_s']:7.1f} {row['speedup']:7.2f}x "
                      f"{row['speedup_min']:5.2f}-{row['speedup_max']:.2f}x {row['acceptance_rate'] or 0:7.2f} "
                      f"{row['mean_acceptance_length'] or 1:8.2f}", flush=True)
        del arms
    llm = LLM(model=args.model, checkpoint=checkpoint, dtype=args.dtype, num_threads=args.num_threads,
              max_model_len=2048, kv_cache_gb=0.25)
    print(f"\nstep cost at context {args.context} (forward + logits, median of {args.step_repeats}, interleaved)")
    figures["step_cost"] = step_costs(llm, configs, args)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
