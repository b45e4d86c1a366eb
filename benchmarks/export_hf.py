"""Write a checkpoint as a Hugging Face directory that vLLM (and transformers) can load.

    python benchmarks/export_hf.py OUT_DIR                 # the embedded default model (SmolLM2-135M-Instruct)
    python benchmarks/export_hf.py OUT_DIR --model PATH    # any checkpoint specwise loads (GGUF or HF dir)

Writes config.json, model.safetensors (HF parameter names, as specwise holds them after
dequantizing), tokenizer.json, tokenizer_config.json (with the chat template) and
generation_config.json. Used by benchmarks/vs_vllm.sh so both servers load the same files.
"""

import argparse
from pathlib import Path

import torch

from specwise.models.checkpoints.loader import load_checkpoint
from specwise.models.export.hf_writer import write_hf_dir


def export(out: Path, model: str | None, dtype: torch.dtype) -> None:
    checkpoint = load_checkpoint(model, dtype)
    write_hf_dir(out, checkpoint.config, checkpoint.weights, checkpoint.tokenizer, dtype)
    print(f"wrote {out} ({checkpoint.path.name}, {len(checkpoint.weights)} tensors, {dtype})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="directory to write")
    parser.add_argument("--model", default=None, help="checkpoint to export (default: the embedded default model)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="dtype of the saved weights (default: float32, the dequantized values unrounded)")
    args = parser.parse_args()
    export(args.out, args.model, getattr(torch, args.dtype))


if __name__ == "__main__":
    main()
