"""`specwise generate`: one prompt in, streamed text out, speed and acceptance at the end."""

import argparse
import sys
import time

from specwise.cli_args import add_dataclass_args, dataclass_from_args
from specwise.config import EngineConfig
from specwise.sampling_params import SamplingParams


def register(subparsers) -> None:
    parser = subparsers.add_parser("generate", help="generate text from a prompt (streamed)",
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="plain completion prompt")
    source.add_argument("--chat", help="a user message; the model's chat template is applied")
    parser.add_argument("--system", help="system message for --chat")
    add_dataclass_args(parser, EngineConfig, exclude=("seed",))   # --seed is the request's
    add_dataclass_args(parser, SamplingParams, exclude=("speculative",))
    parser.set_defaults(handler=run_generate)


def run_generate(args) -> int:
    from specwise.engine.llm_engine import LLMEngine
    engine = LLMEngine(dataclass_from_args(EngineConfig, args))
    params = dataclass_from_args(SamplingParams, args)
    prompt = args.prompt
    if args.chat is not None:
        prompt = ([{"role": "system", "content": args.system}] if args.system else []) + \
                 [{"role": "user", "content": args.chat}]
    engine.add_request(prompt, params)
    started, first_token_at, num_tokens = time.perf_counter(), None, 0
    while engine.has_unfinished():
        for output in engine.step():
            first_token_at = first_token_at or time.perf_counter()
            num_tokens += len(output.new_token_ids)
            sys.stdout.write(output.new_text)
            sys.stdout.flush()
    print_speed(started, first_token_at, num_tokens, engine)
    return 0


def print_speed(started: float, first_token_at: float, num_tokens: int, engine) -> None:
    elapsed = time.perf_counter() - started
    decode = time.perf_counter() - first_token_at
    line = (f"\n\n[{num_tokens} tokens in {elapsed:.2f} s: {num_tokens / elapsed:.1f} tok/s overall, "
            f"{max(num_tokens - 1, 0) / decode if decode > 0 else 0:.1f} tok/s after the first token]")
    stats = engine.stats
    if stats.drafts:
        positions = ", ".join(f"{rate:.2f}" for rate in stats.per_position_acceptance)
        line += (f"\n[speculative {engine.config.speculative}, k={engine.num_speculative_tokens}: "
                 f"acceptance rate {stats.acceptance_rate:.2f}, mean acceptance length "
                 f"{stats.mean_acceptance_length:.2f}, per position {positions}]")
    print(line, file=sys.stderr)
