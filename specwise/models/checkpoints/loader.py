"""Load a checkpoint (HF directory, GGUF file, or the default model) into config, HF-named weights and
tokenizer; build the model from it."""

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from specwise.errors import ModelLoadError
from specwise.models.checkpoints.default_model import default_model_path
from specwise.models.checkpoints.gguf import read_gguf
from specwise.models.checkpoints.hf import read_hf_dir
from specwise.models.config import ModelConfig
from specwise.models.llama import LlamaForCausalLM
from specwise.models.quantize import pack_weights
from specwise.models.rope import RotaryEmbedding
from specwise.models.tokenizer import Tokenizer

GGUF_MAGIC = b"GGUF"


@dataclass
class Checkpoint:
    config: ModelConfig
    weights: dict[str, torch.Tensor]   # HF parameter names, already in the compute dtype
    tokenizer: Tokenizer
    path: Path


def load_checkpoint(path: str | os.PathLike | None, dtype: torch.dtype = torch.float32) -> Checkpoint:
    """None -> the default model; a directory -> HF safetensors checkpoint (or its only .gguf file);
    a GGUF file -> GGUF. Any problem -> ModelLoadError naming the file."""
    path = default_model_path() if path is None else resolve(Path(path).expanduser())
    if path.is_dir():
        config, weights, tokenizer = read_hf_dir(path, dtype)
    elif is_gguf(path):
        config, weights, tokenizer = read_gguf(path, dtype)
    else:
        raise ModelLoadError(path, "not a GGUF file or a Hugging Face model directory (config.json + *.safetensors)")
    if tokenizer.vocab_size > config.vocab_size:
        raise ModelLoadError(path, f"the tokenizer has {tokenizer.vocab_size} tokens but the model only "
                                   f"{config.vocab_size} embeddings")
    stop_ids = list(dict.fromkeys(config.eos_token_ids + tokenizer.eos_token_ids))
    config.eos_token_ids = tokenizer.eos_token_ids = stop_ids
    if config.bos_token_id is None:
        config.bos_token_id = tokenizer.bos_token_id
    return Checkpoint(config=config, weights=weights, tokenizer=tokenizer, path=path)


def resolve(path: Path) -> Path:
    """A directory with no config.json and exactly one .gguf file stands for that file."""
    if not path.exists():
        raise ModelLoadError(path, "no such file or directory")
    if path.is_dir() and not (path / "config.json").exists():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
    return path


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as stream:
            return stream.read(4) == GGUF_MAGIC or path.suffix == ".gguf"
    except OSError as e:
        raise ModelLoadError(path, f"cannot read: {e.strerror or e}") from None


def build_model(checkpoint: Checkpoint, dtype: torch.dtype, device: str, max_positions: int,
                quantization: str = "none", plain: bool = False) -> LlamaForCausalLM:
    """Allocate without random init (meta device), load weights, compute the rope tables, then
    pack the weights in their format (see quantize.py; `plain`: unquantized linears left nn.Linear, for a
    compiled forward or for training)."""
    config = checkpoint.config
    with torch.device("meta"):
        model = LlamaForCausalLM(config, max_positions)
    model = model.to_empty(device=device).to(dtype)
    model.load_weights({name: tensor.to(dtype) for name, tensor in checkpoint.weights.items()})
    model.rotary = RotaryEmbedding(config.head_dim, max_positions, config.rope_theta, config.rope_scaling).to(device)
    return pack_weights(model.eval().requires_grad_(False), dtype, quantization, device, plain)
