"""Does vLLM accept every config our recommendation can write? Asks vLLM's own checks, or launches it.

    python benchmarks/vllm_configs.py MODEL_DIR [--vllm-python ~/.cache/specwise/vllm-venv/bin/python]
    python benchmarks/vllm_configs.py MODEL_DIR --launch [--only suffix@4] [--requests 3]

For n-gram, suffix, a draft model (MODEL_DIR drafting for itself: the project ships no distilled draft
model) and the per-batch-size table (the recommendation's `vllm_dynamic` config, bench/report/
server_configs.py, over an n-gram arm), the flags come from the one translation
(specwise/bench/engine_flags.py, what the report prints and `evaluate --engine` launches).
Default: each set runs through vLLM's serve argument parser, validate_parsed_serve_args and
EngineArgs.create_engine_config in vLLM's environment (the checks a `vllm serve` start makes before
loading weights); prints accepted, or vLLM's own message.
--launch: each config is started through the product launcher (bench/launch: the command
`evaluate --engine vllm` would run, with --per-request-spec-decode-metrics, LaunchedServer's start,
readiness and process-group stop), sent a few greedy streamed requests through the evaluator's
HttpTarget, and checked: the server came up (vLLM accepted the config; the engine's own message if
not), the responses carried per-request acceptance, and vLLM's Prometheus counters moved by the same
drafts, draft tokens and accepted tokens. `--enforce-eager` and VLLM_CPU_KVCACHE_SPACE=2 (unless
set) keep each start short. Heavy: run it under the shared lock.
"""

import argparse
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specwise.bench.engine_flags import vllm_flags, vllm_speculative_config
from specwise.bench.inputs.request import WorkloadRequest
from specwise.bench.launch.command import build_command, free_port
from specwise.bench.launch.memory import KV_ENV
from specwise.bench.launch.server import LaunchError, LaunchedServer
from specwise.bench.load.arms import parse_engine_methods
from specwise.bench.load.targets.base import Acceptance, TargetError
from specwise.bench.load.targets.http import HttpTarget
from specwise.bench.report.server_configs import vllm_config

CHECK = """
import sys
from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
validate_parsed_serve_args(args)
config = EngineArgs.from_cli_args(args).create_engine_config()
print("accepted:", config.speculative_config)
"""
TABLE = [[1, 7, 4], [8, 15, 2], [16, 64, 0]]    # a batch-size table as the recommendation writes it
TABLE_NAME = "ngram, batch-size table"
ENGINE_ARGS = "--enforce-eager --max-model-len 2048 --dtype bfloat16"
PROMPTS = ["List the days of the week, then list them again in the same order: Monday, Tuesday,",
           "Write a Python function that returns the sum of a list, then write it again with a docstring.",
           "Repeat this sentence three times: the quick brown fox jumps over the lazy dog."]


def configs(model: str) -> dict[str, tuple[str, dict]]:
    """name -> (the --methods arm it is launched as, the vLLM config the recommendation writes)."""
    table = vllm_config("ngram", "ngram", 4, TABLE)["vllm_dynamic"]
    return {"ngram@4": ("ngram@4", vllm_speculative_config("ngram", "ngram", 4)),
            "suffix@4": ("suffix@4", vllm_speculative_config("suffix", "suffix", 4)),
            "draft@3": (f"draft:{model}@3", vllm_speculative_config(f"draft:{model}", "draft", 3)),
            TABLE_NAME: ("ngram@4", table)}


def check(model: str, vllm_python: str, config: dict) -> str:
    argv = [vllm_python, "-c", CHECK, "--model", model, "--max-model-len", "2048", *vllm_flags(config)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    verdict = next((line for line in lines if line.startswith("accepted:")), None)
    return verdict or "REFUSED: " + next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines else "")


async def launch(model: str, engine_cmd: str, method: str, config: dict, logs: Path, requests: int) -> str:
    arm = parse_engine_methods(method, "vllm", 4)[0]
    command = build_command("vllm", engine_cmd, model, arm, free_port(), ENGINE_ARGS,
                            env={} if KV_ENV in os.environ else {KV_ENV: "2"})
    at = command.argv.index("--speculative-config") + 1
    command = dataclasses.replace(command, argv=command.argv[:at] + [json.dumps(config)] + command.argv[at + 1:])
    server = LaunchedServer(command, logs / f"{arm.name}-{len(list(logs.iterdir()))}.log")
    began = time.monotonic()
    try:
        server.start()
        await server.wait_ready(900)
        ready = time.monotonic() - began
        target = HttpTarget(name=arm.name, base_url=command.url)
        await target.start()
        before, mine = await target.server_acceptance(), [0, 0, 0]
        for index, prompt in enumerate(PROMPTS[:requests]):
            request = WorkloadRequest(request_id=f"r{index}", category="check", prompt=prompt, max_tokens=64)
            async for event in target.stream(request):
                if isinstance(event, Acceptance):
                    mine = [mine[0] + event.drafts, mine[1] + event.draft_tokens, mine[2] + event.accepted_tokens]
        after = await target.server_acceptance()
        await target.close()
    except LaunchError as error:
        return f"REFUSED: {error}"
    except TargetError as error:
        return f"FAILED while serving: {error} (log: {server.log_path}: {' | '.join(server.log_tail())})"
    finally:
        server.stop()
    server_counts = [after.drafts - (before.drafts if before else 0), after.draft_tokens -
                     (before.draft_tokens if before else 0), after.accepted_tokens -
                     (before.accepted_tokens if before else 0)] if after and after.drafts is not None else None
    agree = "equal" if server_counts == mine else "DIFFERENT"
    verdict = "ACCEPTED and drafting" if mine[0] and server_counts and server_counts[0] else "ACCEPTED, NO DRAFTS"
    return (f"{verdict}: ready in {ready:.0f} s; {requests} greedy requests; drafts / draft tokens / accepted: "
            f"responses {'/'.join(f'{v:g}' for v in mine)}, Prometheus "
            f"{'/'.join(f'{v:g}' for v in server_counts) if server_counts else 'none'} ({agree}); log {server.log_path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", help="a Hugging Face model directory (benchmarks/export_hf.py writes one)")
    parser.add_argument("--vllm-python", default=str(Path.home() / ".cache/specwise/vllm-venv/bin/python"))
    parser.add_argument("--launch", action="store_true", help="start each config in vLLM and send it requests")
    parser.add_argument("--engine-cmd", help="how --launch starts vLLM (default: VLLM_PYTHON -m "
                        "vllm.entrypoints.openai.api_server; tests/fake_engine.py checks this script itself)")
    parser.add_argument("--only", action="append", help="only these configs (by name), e.g. suffix@4")
    parser.add_argument("--requests", type=int, default=3, choices=range(1, len(PROMPTS) + 1))
    args = parser.parse_args()
    engine_cmd = args.engine_cmd or f"{args.vllm_python} -m vllm.entrypoints.openai.api_server"
    logs = Path(tempfile.mkdtemp(prefix="vllm-configs-"))
    for name, (method, config) in configs(args.model).items():
        if args.only and name not in args.only:
            continue
        verdict = (asyncio.run(launch(args.model, engine_cmd, method, config, logs, args.requests))
                   if args.launch else check(args.model, args.vllm_python, config))
        print(f"{name:<24} {json.dumps(config)}\n{'':<24} {verdict[:600]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
