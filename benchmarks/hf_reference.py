"""The transformers reference both benchmarks compare against: the same checkpoint, loaded by HF."""

from pathlib import Path

import torch


def load_hf(model_path: Path, dtype: torch.dtype):
    """A GGUF file (dequantized by transformers itself) or a HF directory, in eval mode."""
    from transformers import AutoModelForCausalLM
    if model_path.is_file():
        model = AutoModelForCausalLM.from_pretrained(str(model_path.parent), gguf_file=model_path.name, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=dtype)
    return model.eval()
