"""Acceptance of a trained drafter on the evaluation suite (never trained on), per category.

    python benchmarks/drafter_acceptance.py specwise/models/heads/smollm2-135m-instruct/eagle
    python benchmarks/drafter_acceptance.py DIR --kind medusa --k 2,3,4 --categories chat,math

Generates the target's greedy responses to the built-in suite's prompts with our engine (cached in
--work), records its features, and simulates chain drafting of k tokens from every response
position, each draft checked by the engine's verifier (greedy_accept): the same measurement
`specwise train-drafter` makes on its held-out prompts (specwise/train/acceptance.py). It says
how far ahead the drafter guesses, not how fast: speed needs the engine's proposer (spec_speedup.py).
"""

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch

from specwise.bench.inputs.suite import load_suite, parse_categories
from specwise.config import EngineConfig
from specwise.engine.llm_engine import LLMEngine
from specwise.models.capabilities import compute_dtype
from specwise.models.checkpoints.drafter import load_drafter, read_drafter_config, target_signature
from specwise.models.checkpoints.loader import build_model, load_checkpoint
from specwise.train.acceptance import held_out_acceptance
from specwise.train.data import build_corpus, data_key
from specwise.train.eagle import EagleObjective
from specwise.train.eagle3 import Eagle3Objective
from specwise.train.medusa import MedusaObjective


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("drafter", help="a drafter directory (specwise train-drafter --out)")
    parser.add_argument("--model", default=None, help="target (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--categories", default=None, help="suite categories, comma-separated (default: all)")
    parser.add_argument("--k", default="4", help="draft tokens per step, comma-separated")
    parser.add_argument("--max-tokens", type=int, default=192, help="most response tokens per prompt")
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "specwise-suite-features"),
                        help="where the suite's responses and features are cached")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = compute_dtype("auto", "cpu")
    checkpoint = load_checkpoint(args.model, dtype)
    requests = load_suite(parse_categories(args.categories))
    engine = LLMEngine(EngineConfig(model=args.model, num_threads=args.threads), checkpoint)
    key = data_key(requests, target_signature(checkpoint.config, checkpoint.tokenizer),
                   dict(max_tokens=args.max_tokens, dtype=str(engine.dtype), suite=True))
    started = time.perf_counter()
    drafter = read_drafter_config(args.drafter)
    # eagle3 reads the target's residual streams at its layers too (recorded once more beside the features)
    corpus = build_corpus(engine, requests, [True] * len(requests), Path(args.work) / key, args.max_tokens, 0.0, 0,
                          drafter.aux_layers)
    print(f"# machine: {platform.machine()} {torch.get_num_threads()} threads; suite: {corpus.num_seqs} prompts, "
          f"{len(corpus.token_ids)} tokens ({time.perf_counter() - started:.0f} s to generate or read)")
    target = build_model(checkpoint, torch.float32, "cpu", engine.max_model_len)
    everything = torch.arange(checkpoint.config.vocab_size)
    if drafter.kind == "eagle":
        objective = EagleObjective(target, drafter.target, everything, init_from_target=False)
    elif drafter.kind == "eagle3":
        objective = Eagle3Objective(target, drafter.target, everything, drafter.aux_layers)
    else:
        objective = MedusaObjective(target, drafter.target, everything, drafter.num_heads)
    _, head = load_drafter(args.drafter, checkpoint.config, checkpoint.tokenizer, torch.float32)
    objective.module = head
    print(f"# {drafter.kind} drafter {args.drafter}: mean acceptance length (per-position acceptance)")
    results = {}
    for k in [int(value) for value in args.k.split(",")]:
        stats = held_out_acceptance(objective, corpus, list(range(corpus.num_seqs)), k)
        results[k] = {name: {"mean_acceptance_length": s.mean_acceptance_length,
                             "per_position": s.per_position_acceptance, "drafts": s.drafts}
                      for name, s in stats.items()}
        for name, s in stats.items():
            positions = " ".join(f"{p:.2f}" for p in s.per_position_acceptance or [])
            print(f"k={k}  {name:14s} {s.mean_acceptance_length or 1:.2f}  ({positions})  drafts {s.drafts}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
