"""Write a model as a Hugging Face directory: config.json, model.safetensors (HF parameter names),
tokenizer.json, tokenizer_config.json (with the chat template) and generation_config.json, the
files checkpoints/hf.py reads back (and vLLM and transformers load)."""

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from specwise.errors import ModelLoadError
from specwise.models.config import ModelConfig
from specwise.models.llama import LlamaForCausalLM
from specwise.models.tokenizer import Tokenizer

ARCHITECTURE_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def hf_config(config: ModelConfig, dtype: torch.dtype) -> dict:
    eos = config.eos_token_ids
    return {
        "architectures": [ARCHITECTURE_CLASSES[config.architecture]],
        "model_type": config.architecture,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": config.rope_scaling,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.attention_bias,
        "mlp_bias": False,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else eos,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def tokenizer_config(tokenizer: Tokenizer) -> dict:
    special = {i: token for i, token in sorted(tokenizer.backend.get_added_tokens_decoder().items()) if token.special}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokenizer.bos_token or None,
        "eos_token": tokenizer.eos_token or None,
        "pad_token": tokenizer.eos_token or None,
        "unk_token": None,
        "add_bos_token": tokenizer.add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000,
        "additional_special_tokens": [t.content for t in special.values()
                                      if t.content not in (tokenizer.bos_token, tokenizer.eos_token)],
        "chat_template": tokenizer.chat_template,
    }


def split_fused(name: str, tensor: torch.Tensor, config: ModelConfig) -> dict[str, torch.Tensor]:
    """One of our parameters under HF names: fused q/k/v and gate/up split again (load_weights fuses them).
    "self_attn.qkv_proj.weight" [q + 2 kv, hidden] -> "self_attn.q_proj.weight", "...k_proj...", "...v_proj..."."""
    q_size, kv_size = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    if name.endswith(".qkv_proj.weight") or name.endswith(".qkv_proj.bias"):
        prefix, suffix = name.rsplit(".qkv_proj.", 1)
        return {f"{prefix}.{part}_proj.{suffix}": piece
                for part, piece in zip("qkv", tensor.split([q_size, kv_size, kv_size]))}
    if name.endswith(".gate_up_proj.weight"):
        prefix = name.removesuffix(".gate_up_proj.weight")
        gate, up = tensor.chunk(2)
        return {f"{prefix}.gate_proj.weight": gate, f"{prefix}.up_proj.weight": up}
    return {name: tensor}


def hf_weights(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """The model's parameters under HF names (see split_fused)."""
    config = model.config
    weights = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            if not config.tie_word_embeddings:
                weights[name] = tensor.detach()
        else:
            parts = split_fused(name, tensor.detach(), config)
            weights.update({f"model.{part}": piece for part, piece in parts.items()})
    return weights


def write_hf_dir(out: str | Path, config: ModelConfig, weights: dict[str, torch.Tensor], tokenizer: Tokenizer,
                 dtype: torch.dtype) -> Path:
    """HF-named `weights`, cast to `dtype`, with the config and tokenizer files beside them."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.to(dtype).contiguous() for name, tensor in weights.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(config, dtype), indent=2) + "\n")
    generation = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_ids}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tokenizer.backend.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tokenizer), indent=2) + "\n")
    return out


def write_checkpoint(out: Path, tensors: dict[str, torch.Tensor], config: dict, dtype: torch.dtype,
                     exact: dict[str, torch.Tensor] | None = None) -> None:
    """config.json and model.safetensors (every tensor in dtype; `exact` ones as they are, e.g. int64 ids)
    into the directory out."""
    weights = {name: tensor.to(dtype).contiguous() for name, tensor in tensors.items()}
    weights.update({name: tensor.contiguous() for name, tensor in (exact or {}).items()})
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def read_checkpoint(directory: str | Path, what: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, the weights) of a directory write_checkpoint wrote; ModelLoadError naming `what` if unreadable."""
    directory = Path(directory)
    try:
        return json.loads((directory / "config.json").read_text()), load_file(str(directory / "model.safetensors"))
    except (OSError, ValueError, SafetensorError) as e:
        raise ModelLoadError(directory, f"not a {what} directory: {e}") from None


def check_weight_shapes(directory: str | Path, weights: dict[str, torch.Tensor], shapes: dict[str, tuple]) -> None:
    """The checkpoint holds exactly the tensors `shapes` names, each with its shape; else one ModelLoadError."""
    if set(weights) != set(shapes):
        raise ModelLoadError(directory, f"weights {sorted(set(weights) ^ set(shapes))[:3]} missing or unexpected")
    for name, shape in shapes.items():
        if tuple(weights[name].shape) != shape:
            raise ModelLoadError(directory, f"{name} has shape {tuple(weights[name].shape)}, expected {shape}")
