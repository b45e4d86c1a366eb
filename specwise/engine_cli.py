"""`specwise generate` and `specwise calibrate`: the engine from the command line (`calibrate --endpoint`
times any OpenAI-compatible server instead: bench/calibrate/)."""

import argparse
import json
import platform
import sys
import time

import numpy as np
from rich.progress import Progress

from specwise.bench.calibrate.command import calibrate_endpoints, parse_arms, refit
from specwise.bench.calibrate.sweep import SweepDesign
from specwise.bench.inputs.suite import CATEGORIES, parse_categories
from specwise.cli_args import add_dataclass_args, dataclass_from_args
from specwise.config import EngineConfig
from specwise.engine.cost.linear_cost import StepShape
from specwise.engine.cost.step_fit import FitOptions, StepSample, fit, grid_samples
from specwise.engine.cost.step_profile import ProfileCost, prefill_prompts
from specwise.errors import ConfigError
from specwise.sampling_params import SamplingParams


def register(subparsers) -> None:
    register_generate(subparsers)
    register_calibrate(subparsers)


def register_generate(subparsers) -> None:
    parser = subparsers.add_parser("generate", help="generate text from a prompt (streamed)",
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="plain completion prompt")
    source.add_argument("--chat", help="a user message; the model's chat template is applied")
    parser.add_argument("--system", help="system message for --chat")
    add_dataclass_args(parser, EngineConfig, exclude=("seed",))   # --seed is the request's
    add_dataclass_args(parser, SamplingParams, exclude=("speculative", "logit_bias", "logprobs", "prompt_logprobs",
                                                        "structured_output"))
    parser.set_defaults(handler=run_generate)


def run_generate(args) -> int:
    from specwise.engine.llm_engine import LLMEngine    # torch (~3 s): paid only by commands that run the engine
    params = dataclass_from_args(SamplingParams, args)          # bad flags fail before the model loads
    engine = LLMEngine(dataclass_from_args(EngineConfig, args))
    prompt = args.prompt
    if args.chat is not None:
        prompt = ([{"role": "system", "content": args.system}] if args.system else []) + \
                 [{"role": "user", "content": args.chat}]
    engine.add_request(prompt, params)                          # a bad prompt fails here, alone on stderr
    print(f"specwise: engine: {engine.kernel_line}", file=sys.stderr, flush=True)
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


OWN_BATCH_SIZES, ENDPOINT_BATCH_SIZES = "1,2,4,8,16,32,64", "1,4,16,64"


def register_calibrate(subparsers) -> None:
    parser = subparsers.add_parser(
        "calibrate", help="measure the step cost of our engine on this machine, or of any OpenAI-compatible "
                          "server (--endpoint); save a step profile",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_dataclass_args(parser, EngineConfig, exclude=("speculative", "num_speculative_tokens", "seed"))
    add_dataclass_args(parser, FitOptions)              # the step-cost fit, our engine's and --endpoint's alike
    endpoint = parser.add_argument_group(
        "a server instead of our engine (--endpoint): a designed sweep of waves; --max-num-batched-tokens there "
        "is the server's (a longer prefill probe counts as its chunks; default: what the server says, else none)")
    endpoint.add_argument("--endpoint", help="OpenAI-compatible server URL to calibrate (then --model names the "
                                             "served model; default: the server's first)")
    endpoint.add_argument("--speculative-arm", action="append", default=[], metavar="METHOD=URL",
                          help="the same engine speculating with METHOD, served at URL: its steps are fitted as "
                               "METHOD's own cost (repeatable)")
    endpoint.add_argument("--prompt-tokens", default="32,256", help="prompt lengths of the waves, comma-separated")
    endpoint.add_argument("--output-tokens", type=int, default=48, help="forced output length of every request")
    endpoint.add_argument("--prefill-lens", default="32,256,1024",
                          help="prompt lengths of the single requests that time a prefill each, comma-separated")
    endpoint.add_argument("--prefill-repeats", type=int, default=3, help="single requests per prefill length "
                                                                        "(median kept)")
    endpoint.add_argument("--count-probes", type=int, default=0,
                          help="token counts the count probe runs, then revisits each beside a new one (what a "
                               "step of a count the server has not run lately costs; e.g. 32, about 10 s a "
                               "server; 0: no probe, as the cost was 0-5 ms on the servers measured and charging "
                               "it made no replay better, docs/calculators.md)")
    endpoint.add_argument("--budget", type=float, default=180.0, help="seconds for the whole sweep, warm-up included")
    endpoint.add_argument("--categories", default="all",
                          help="suite categories the prompts are cut from, in turn within each wave (comma-separated)")
    endpoint.add_argument("--refit", metavar="PROFILE", nargs="+",
                          help="fit a recorded sweep again (a profile calibrate --endpoint wrote, with the requests "
                               "it kept beside it), no server needed; writes --output. Several: their waves fitted "
                               "together (sweeps of the same servers at other times, before and after a run)")
    endpoint.add_argument("--kv-reads", metavar="GROUP/BLOCK", default=None,
                          help="how the server's attention reads its KV cache: GROUP sequences at a time to the "
                               "longest's context, in whole blocks of BLOCK tokens (specwise serve: 16/16), or "
                               "none (each sequence its own, as vLLM's paged attention); default: what the server "
                               "says on /health, else none (with --refit: what the sweep recorded)")
    endpoint.add_argument("--window-seed", type=int, default=None,
                          help="where in the categories' texts the prompts start (default: a fresh place each "
                               "sweep, as real traffic's prompts are new to the server)")
    parser.add_argument("--batch-sizes", default=None,
                        help=f"comma-separated (default: {OWN_BATCH_SIZES}; with --endpoint {ENDPOINT_BATCH_SIZES})")
    parser.add_argument("--tokens-per-seq", default="1,2,3,5,9", help="1 + k values, comma-separated")
    parser.add_argument("--context-lens", default="0,128,512,1024", help="cached tokens per sequence")
    parser.add_argument("--prefill-tokens", default="256,1024,4096",
                        help="prompt tokens per timed prefill step, comma-separated (empty: none)")
    parser.add_argument("--prefill-prompt-len", type=int, default=256,
                        help="prompt length making up those prefill steps")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per point (median kept)")
    parser.add_argument("--output", default="step-profile.json", help="profile JSON to write")
    parser.set_defaults(handler=run_calibrate)


def run_calibrate(args) -> int:
    if args.refit:
        refit(args.refit, args.output, dataclass_from_args(FitOptions, args), server_token_budget(args),
              args.kv_reads)
        return 0
    if args.endpoint:
        return run_endpoint_calibrate(args)
    if args.speculative_arm:
        raise ConfigError("--speculative-arm calibrates a server: give its plain twin with --endpoint URL")
    import torch                                        # torch (~3 s): paid only by commands that run the engine
    from specwise.engine.llm_engine import LLMEngine
    from specwise.engine.profiler import measure_grid, measure_prefill
    axes = [parse_int_list(text, name) for text, name in
            ((args.batch_sizes or OWN_BATCH_SIZES, "--batch-sizes"), (args.tokens_per_seq, "--tokens-per-seq"),
             (args.context_lens, "--context-lens"))]
    prefill_tokens = parse_int_list(args.prefill_tokens, "--prefill-tokens") if args.prefill_tokens.strip() else []
    engine = LLMEngine(dataclass_from_args(EngineConfig, args))
    print(f"specwise: engine: {engine.kernel_line}", file=sys.stderr, flush=True)
    if max(axes[2]) + max(axes[1]) > engine.max_model_len:
        raise ConfigError(f"--context-lens + --tokens-per-seq exceed the context window ({engine.max_model_len})")
    if not 0 < args.prefill_prompt_len <= engine.max_model_len:
        raise ConfigError(f"--prefill-prompt-len must be in 1..{engine.max_model_len}, got {args.prefill_prompt_len}")
    with Progress() as progress:
        task = progress.add_task("timing steps", total=len(axes[0]) * len(axes[1]) * len(axes[2]) + len(prefill_tokens))
        advance = lambda: progress.advance(task)        # noqa: E731
        seconds = measure_grid(engine.runner, *axes, repeats=args.repeats, on_point=advance)
        totals, prefill_seconds = measure_prefill(engine.runner, prefill_tokens, args.prefill_prompt_len,
                                                  args.repeats, advance)
    prefill = dict(prefill_tokens=totals, prefill_seconds=prefill_seconds,
                   prefill_prompt_len=args.prefill_prompt_len) if totals else {}
    prefill["prefill_pads_to_longest"] = False      # flat steps: a prefill costs its total prompt tokens
    profile = ProfileCost(*axes, seconds, prefill=prefill,
                          machine=f"{platform.machine()} {platform.processor() or ''} "
                                  f"{torch.get_num_threads()} threads".strip(),
                          model=f"{engine.model_config.architecture} {engine.config.model or 'SmolLM2-135M'} "
                                f"{str(engine.dtype).removeprefix('torch.')}")
    data = profile.to_json()
    reads = engine.runner.kv_reads
    samples = grid_samples(*axes, seconds, reads) + [timed_prefill_sample(total, time, args.prefill_prompt_len)
                                                     for total, time in zip(totals, prefill_seconds)]
    try:
        linear = fit(samples, dataclass_from_args(FitOptions, args), reads)
        print(f"fitted {linear.summary()}")
        data["linear"] = linear.to_json()
    except ConfigError as error:
        print(f"no linear fit: {error}")
    with open(args.output, "w", encoding="utf-8") as stream:
        json.dump(data, stream, indent=1)
    print(f"wrote {args.output}: batch 1 decode {seconds[0][0][0] * 1000:.1f} ms/step")
    return 0


def timed_prefill_sample(total: int, seconds: float, prompt_len: int) -> StepSample:
    """A timed prefill step (measure_prefill's prompts over no cache): it samples one row per prompt."""
    count, length = prefill_prompts(total, prompt_len)
    return StepSample(StepShape.of(np.full(count, length), 0.0), seconds, logits_rows=count)


def run_endpoint_calibrate(args) -> int:
    design = SweepDesign(batch_sizes=parse_int_list(args.batch_sizes or ENDPOINT_BATCH_SIZES, "--batch-sizes"),
                         prompt_tokens=parse_int_list(args.prompt_tokens, "--prompt-tokens"),
                         output_tokens=args.output_tokens, budget_s=args.budget,
                         categories=parse_categories(args.categories) or list(CATEGORIES),
                         prefill_tokens=parse_int_list(args.prefill_lens, "--prefill-lens"),
                         prefill_repeats=args.prefill_repeats, window_seed=args.window_seed,
                         max_num_batched_tokens=server_token_budget(args), count_probes=args.count_probes,
                         kv_reads=args.kv_reads)
    model = getattr(args, "model", None)              # EngineConfig's flag, absent from the namespace when not given
    calibrate_endpoints(args.endpoint, parse_arms(args.speculative_arm), design, model, args.output,
                        dataclass_from_args(FitOptions, args))
    return 0


def server_token_budget(args) -> int | None:
    """--max-num-batched-tokens as the calibrated server's budget, where given (EngineConfig's flag, absent
    from the namespace when not given)."""
    return getattr(args, "max_num_batched_tokens", None)


def parse_int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ConfigError(f"{flag} takes comma-separated whole numbers, got {text!r}") from None
    if not values or values != sorted(set(values)) or values[0] < 0:
        raise ConfigError(f"{flag} must be increasing non-negative numbers, got {text!r}")
    return values

