"""Suffix decoding against n-gram, per suite category, and the global cache's memory bound.

Terms: an **arm** is off, ngram@k or suffix@k. A **pass** of an arm serves every request of a
category once, at concurrency 1, greedy; agentic sessions are replayed in order, each turn
carrying the answer the previous turn produced (as bench/load/sessions.py does). Greedy output
is lossless, so every arm generates the same tokens; **speedup** = the arm's output tokens/s
(prompt included, as a user sees it) / off's in the same repeat. Arms run interleaved, in an
order rotated each repeat, so drift on a shared machine cancels; the median over repeats is
printed with the range. Each pass starts a fresh drafter, so suffix's global cache holds only
that pass's earlier responses (no leak from earlier passes).

Memory: REPLAY_REQUESTS synthetic responses (lengths 20-400 tokens, a vocabulary of 49k, half
the responses reusing an earlier one with edits, like agent traffic) go through a
GlobalSuffixCache of --cache-tokens; prints the peak tokens held (the bound is on these) and
the peak Python heap (tracemalloc) per cached token.

    python benchmarks/suffix_speedup.py                                   # default model
    python benchmarks/suffix_speedup.py --categories agentic --ks 4,8 --repeats 3 --max-tokens 128
    python benchmarks/suffix_speedup.py --memory-only
"""

import argparse
import json
import random
import statistics
import sys
import time
import tracemalloc

from specwise.bench.inputs.suite import CATEGORIES, load_suite
from specwise.engine.spec_decode.suffix import GlobalSuffixCache

REPLAY_REQUESTS = 10_000


def sessions_in_order(requests):
    """Requests grouped: a session's turns in turn order; a request without a session is its own group."""
    groups = {}
    for request in requests:
        key = request.extra.get("session", request.request_id)
        groups.setdefault(key, []).append(request)
    return [sorted(group, key=lambda r: r.extra.get("turn", 0)) for group in groups.values()]


def run_pass(llm, groups, max_tokens):
    from specwise.sampling_params import SamplingParams
    tokens, started = 0, time.perf_counter()
    for group in groups:
        history = None
        for request in group:
            messages = request.messages
            if history is not None:
                last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
                messages = history + messages[last + 1:]
            params = SamplingParams(temperature=0, max_tokens=min(request.max_tokens, max_tokens))
            output = llm.generate(messages, params)[0]
            tokens += len(output.output_token_ids)
            history = messages + [{"role": "assistant", "content": output.text}]
    stats = llm.engine.stats
    return tokens / (time.perf_counter() - started), stats.acceptance_rate if stats.drafts else 0.0, \
        stats.mean_acceptance_length if stats.drafts else 1.0


def speedups(llm, category, ks, repeats, max_tokens):
    groups = sessions_in_order(load_suite([category]))
    arms = ["off"] + [f"{method}@{k}" for k in ks for method in ("ngram", "suffix")]
    rates = {arm: [] for arm in arms}
    acceptance = {}
    for repeat in range(repeats):
        order = arms[repeat % len(arms):] + arms[:repeat % len(arms)]
        for arm in order:
            method, _, k = arm.partition("@")
            llm.engine.set_speculative(None if method == "off" else method, int(k or 4))
            llm.engine.stats = type(llm.engine.stats)()
            rate, accepted, length = run_pass(llm, groups, max_tokens)
            rates[arm].append(rate)
            print(f"  {category} repeat {repeat} {arm}: {rate:.1f} tok/s, acceptance {accepted:.2f}, "
                  f"mean length {length:.2f}", file=sys.stderr, flush=True)
            acceptance[arm] = (accepted, length)
    rows = {}
    for arm in arms[1:]:
        ratios = [rate / base for rate, base in zip(rates[arm], rates["off"])]
        rows[arm] = {"speedup": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                     "acceptance_rate": acceptance[arm][0], "mean_acceptance_length": acceptance[arm][1]}
    return {"off_tok_s": statistics.median(rates["off"]), "arms": rows}


def memory(cache_tokens, seed=0):
    rng = random.Random(seed)
    cache = GlobalSuffixCache(cache_tokens)
    kept = []
    tracemalloc.start()
    for _ in range(REPLAY_REQUESTS):
        if kept and rng.random() < 0.5:
            tokens = list(rng.choice(kept))
            for _ in range(rng.randrange(1, 5)):
                tokens[rng.randrange(len(tokens))] = rng.randrange(49_152)
        else:
            tokens = [rng.randrange(49_152) for _ in range(rng.randrange(20, 400))]
        kept = (kept + [tokens])[-50:]
        cache.add(None, tokens)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    cache.check()
    stats = cache.stats()
    return dict(stats, requests=REPLAY_REQUESTS, peak_heap_mb=peak / 2**20,
                heap_bytes_per_token=peak / max(stats["peak_tokens"], 1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--categories", default=",".join(CATEGORIES))
    parser.add_argument("--ks", default="4,8")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--cache-tokens", type=int, default=200_000)
    parser.add_argument("--memory-only", action="store_true")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    figures = {"memory": memory(args.cache_tokens)}
    print(json.dumps(figures["memory"]), flush=True)
    if not args.memory_only:
        from specwise.engine.llm import LLM
        llm = LLM(dtype="auto")
        ks = [int(k) for k in args.ks.split(",")]
        llm.generate("Hello", None)     # warm-up
        for category in args.categories.split(","):
            figures[category] = speedups(llm, category, ks, args.repeats, args.max_tokens)
            print(category, json.dumps(figures[category]), flush=True)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(figures, file, indent=1)


if __name__ == "__main__":
    main()
