"""Does vLLM accept every config our recommendation can write? Asks vLLM's own parser and config checks.

    python benchmarks/vllm_configs.py MODEL_DIR [--vllm-python ~/.cache/specwise/vllm-venv/bin/python]

For n-gram, suffix, a draft model (MODEL_DIR drafting for itself) and the per-batch-size table,
the flags come from the one translation (specwise/bench/engine_flags.py, what the report prints
and `evaluate --engine` launches); each set runs through vLLM's serve argument parser,
validate_parsed_serve_args and EngineArgs.create_engine_config, in vLLM's environment: the same
checks a `vllm serve` start makes before loading weights. Prints accepted, or vLLM's own message.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

from specwise.bench.engine_flags import vllm_flags, vllm_speculative_config

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


def configs(model: str) -> dict[str, dict]:
    ngram = vllm_speculative_config("ngram", "ngram", 4)
    return {"ngram@4": ngram,
            "suffix@4": vllm_speculative_config("suffix", "suffix", 4),
            "draft@3": vllm_speculative_config(f"draft:{model}", "draft", 3),
            "ngram, batch-size table": dict(ngram, num_speculative_tokens=4,
                                            num_speculative_tokens_per_batch_size=TABLE)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", help="a Hugging Face model directory (benchmarks/export_hf.py writes one)")
    parser.add_argument("--vllm-python", default=str(Path.home() / ".cache/specwise/vllm-venv/bin/python"))
    args = parser.parse_args()
    for name, config in configs(args.model).items():
        argv = [args.vllm_python, "-c", CHECK, "--model", args.model, "--max-model-len", "2048", *vllm_flags(config)]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
        verdict = next((line for line in lines if line.startswith("accepted:")), None)
        if verdict is None:
            verdict = "REFUSED: " + next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines else "")
        print(f"{name:<24} {json.dumps(config)}\n{'':<24} {verdict[:400]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
