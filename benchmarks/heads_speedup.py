"""Trained drafters (EAGLE, Medusa, a draft model) against n-gram, per suite category, at concurrency 1.

Terms: an **arm** is off, ngram, or one drafter directory given on the command line
(`--eagle DIR`, `--medusa DIR`, `--draft DIR`, each repeatable; `--eagle builtin` / `--medusa
builtin` take the head shipped for the target), all at the same k (default 4), greedy. A
**pass** serves every request of a category once, one request at a time. Arms run
interleaved: each repeat runs every arm's pass, in an order rotated each repeat, so drift of
a shared machine cancels. Greedy output is lossless, so every arm generates the same tokens
(checked: a mismatch is printed).

Per category and arm:
  mean acc. length   1 + accepted / drafts (docs/design.md), over all repeats
  per position       accepted at position i / drafts, i = 0 .. k-1
  draft cost         seconds in the proposer per draft token / off's decode step (its TPOT, the
                     time of one target step at batch 1): the cost of one draft token in target steps
  speedup            the arm's output tokens/s (prompt included, as a user sees it) / off's in the
                     same repeat: median over repeats [min - max]

    python benchmarks/heads_speedup.py --eagle builtin                       # default model, every category
    python benchmarks/heads_speedup.py --eagle runs/eagle --medusa runs/medusa --draft runs/draft \\
        --per-category 3 --max-tokens 128 --repeats 2 --json heads.json
    python benchmarks/heads_speedup.py --eagle /tmp/e --categories chat,math --per-category 1 --max-tokens 32
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specwise.bench.inputs.suite import CATEGORIES, load_suite  # noqa: E402
from specwise.engine.llm import LLM  # noqa: E402
from specwise.engine.spec_decode.metrics import SpecStats  # noqa: E402
from specwise.sampling_params import SamplingParams  # noqa: E402


@dataclass
class Pass:
    """One arm's figures over one category, summed over its passes."""

    tokens: int = 0
    seconds: float = 0.0
    decode_seconds: float = 0.0         # after each request's first token
    decode_tokens: int = 0              # tokens after each request's first
    spec: SpecStats = field(default_factory=SpecStats)
    rates: list[float] = field(default_factory=list)     # tokens/s of each pass
    outputs: dict[str, list[int]] = field(default_factory=dict)

    @property
    def tpot(self) -> float | None:
        return self.decode_seconds / self.decode_tokens if self.decode_tokens else None


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="target: HF directory or GGUF file (default: the default model)")
    for kind in ("eagle", "medusa", "draft"):
        parser.add_argument(f"--{kind}", action="append", default=[], metavar="DIR",
                            help=f"a {kind} drafter directory (repeatable)"
                                 + ("; 'builtin' for the head shipped for the target" if kind != "draft" else ""))
    parser.add_argument("--no-ngram", action="store_true", help="leave the ngram arm out")
    parser.add_argument("--categories", default=",".join(CATEGORIES), help="suite categories (default: all)")
    parser.add_argument("--per-category", type=int, default=3, help="requests per category (default 3)")
    parser.add_argument("--max-tokens", type=int, default=128, help="cap on output tokens per request (default 128)")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per step (default 4)")
    parser.add_argument("--repeats", type=int, default=2, help="passes per arm and category (default 2)")
    parser.add_argument("--dtype", default="auto", help="compute dtype (default auto)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    return parser.parse_args(argv)


def arms_of(args) -> dict[str, str | None]:
    """arm name -> --speculative text (None = off)."""
    arms = {"off": None}
    if not args.no_ngram:
        arms["ngram"] = "ngram"
    for kind in ("eagle", "medusa", "draft"):
        for directory in getattr(args, kind):
            builtin = directory == "builtin" and kind != "draft"
            name = f"{kind}" if builtin else f"{kind}:{Path(directory).name}"
            arms[name] = kind if builtin else f"{kind}:{directory}"
    return arms


def run_request(engine, token_ids: list[int], max_tokens: int) -> tuple[list[int], float, float]:
    """(output token ids, seconds to the first token, seconds in all) of one request served alone."""
    started = time.perf_counter()
    engine.add_request(token_ids, SamplingParams(temperature=0, max_tokens=max_tokens))
    first = None
    output = None
    while engine.has_unfinished():
        for step_output in engine.step():
            first = first or time.perf_counter()
            output = step_output
    return output.output_token_ids, first - started, time.perf_counter() - started


def run_pass(llm: LLM, requests, max_tokens: int, figures: Pass) -> None:
    engine = llm.engine
    engine.stats = SpecStats()
    tokens, started = 0, time.perf_counter()
    for request in requests:
        ids = llm.tokenizer.apply_chat_template(request.messages) if request.messages else \
            llm.tokenizer.encode(request.prompt)
        output, ttft, seconds = run_request(engine, ids, min(request.max_tokens, max_tokens))
        tokens += len(output)
        if len(output) > 1:
            figures.decode_seconds += seconds - ttft
            figures.decode_tokens += len(output) - 1
        figures.outputs[request.request_id] = output
    seconds = time.perf_counter() - started
    figures.tokens += tokens
    figures.seconds += seconds
    figures.rates.append(tokens / seconds)
    figures.spec = figures.spec.merge(engine.stats)


def bench_category(llm: LLM, arms: dict[str, str | None], category: str, args) -> dict[str, Pass]:
    requests = load_suite([category], per_category=args.per_category)
    figures = {name: Pass() for name in arms}
    names = list(arms)
    for repeat in range(args.repeats):
        order = names[repeat % len(names):] + names[:repeat % len(names)]
        for name in order:
            llm.engine.set_speculative(arms[name], args.k)
            run_request(llm.engine, llm.tokenizer.encode("Hello"), 4)          # warm-up, not counted
            run_pass(llm, requests, args.max_tokens, figures[name])
            print(f"  {category} repeat {repeat} {name}: {figures[name].rates[-1]:.1f} tok/s", file=sys.stderr,
                  flush=True)
    reference = figures["off"].outputs
    for name, arm in figures.items():
        different = [rid for rid, tokens in arm.outputs.items() if tokens != reference[rid]]
        if different:
            print(f"[{category}] {name}: greedy output differs from off for {different} (expected identical)",
                  file=sys.stderr)
    return figures


def summarize(figures: dict[str, Pass]) -> dict[str, dict]:
    base = figures["off"]
    rows = {}
    for name, arm in figures.items():
        ratios = [rate / off for rate, off in zip(arm.rates, base.rates)]
        spec = arm.spec
        cost = None
        if spec.draft_tokens and base.tpot:
            cost = spec.drafting_seconds / spec.draft_tokens / base.tpot
        rows[name] = {"tokens_per_s": arm.tokens / arm.seconds, "speedup": statistics.median(ratios),
                      "speedup_min": min(ratios), "speedup_max": max(ratios), "tpot_ms": 1000 * (arm.tpot or 0),
                      "mean_acceptance_length": spec.mean_acceptance_length,
                      "per_position_acceptance": spec.per_position_acceptance,
                      "draft_cost_per_token": cost, "spec": spec.to_dict()}
    return rows


def fmt(value, spec=".2f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(results: dict[str, dict[str, dict]], k: int) -> None:
    header = (f"{'category':<14} {'arm':<22} {'mean len':>8} {'per position (' + str(k) + ')':<26} "
              f"{'draft cost':>10} {'speedup [min-max]':>20} {'tok/s':>7}")
    print(header)
    print("-" * len(header))
    for category, rows in results.items():
        for name, row in rows.items():
            positions = row["per_position_acceptance"]
            positions = " ".join(f"{value:.2f}" for value in positions[:k]) if positions else "-"
            speedup = f"{row['speedup']:.2f} [{row['speedup_min']:.2f}-{row['speedup_max']:.2f}]"
            print(f"{category:<14} {name:<22} {fmt(row['mean_acceptance_length']):>8} {positions:<26} "
                  f"{fmt(row['draft_cost_per_token'], '.3f'):>10} {speedup:>20} {row['tokens_per_s']:>7.1f}")
        print()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=2048)
    arms = arms_of(args)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), {llm.engine.dtype}; arms: {', '.join(arms)}; k={args.k}, "
          f"greedy, up to {args.max_tokens} tokens, {args.per_category} per category, {args.repeats} repeats",
          flush=True)
    results = {}
    for category in [name.strip() for name in args.categories.split(",") if name.strip()]:
        results[category] = summarize(bench_category(llm, arms, category, args))
        print_table({category: results[category]}, args.k)
    print("draft cost: proposer seconds per draft token / off's decode step; speedup: tokens/s over off, "
          "median of repeats")
    print_table(results, args.k)
    if args.json:
        Path(args.json).write_text(json.dumps({"arms": arms, "k": args.k, "dtype": str(llm.engine.dtype),
                                               "max_tokens": args.max_tokens, "per_category": args.per_category,
                                               "repeats": args.repeats, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
