"""The target model as EngineConfig describes it, built in one place: by the engine, and by the compile worker
(compile_worker.py), whose graphs are only used if it builds exactly the model the engine has (the compile
cache's key digests its weights, rope tables included, so max_model_len counts)."""

from dataclasses import dataclass

import torch

from specwise.config import EngineConfig
from specwise.models.capabilities import compute_dtype
from specwise.models.checkpoints.loader import Checkpoint, build_model, load_checkpoint
from specwise.models.llama import LlamaForCausalLM


@dataclass
class TargetModel:
    checkpoint: Checkpoint
    dtype: torch.dtype
    max_model_len: int                  # config.max_model_len, at most the model's own positions
    model: LlamaForCausalLM


def build_target(config: EngineConfig, checkpoint: Checkpoint | None = None, for_compile: bool = False) -> TargetModel:
    """for_compile: unquantized linears left nn.Linear for inductor to pack (loader.build_model's `plain`)."""
    dtype = compute_dtype(config.dtype, config.device)
    checkpoint = checkpoint or load_checkpoint(config.model, dtype)
    max_model_len = min(config.max_model_len, checkpoint.config.max_position_embeddings)
    model = build_model(checkpoint, dtype, config.device, max_model_len, config.quantization, for_compile)
    return TargetModel(checkpoint, dtype, max_model_len, model)
