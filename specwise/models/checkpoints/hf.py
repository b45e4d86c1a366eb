"""Read a local Hugging Face checkpoint directory: config.json, *.safetensors (sharded or not) and the tokenizer.

Also the one list of HF parameter names and shapes that every loader's output is checked against.
"""

import json
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError, safe_open

from specwise.errors import ConfigError, ModelLoadError
from specwise.models.config import ARCHITECTURES, ModelConfig
from specwise.models.tokenizer import Tokenizer, one_line

SHARD_INDEX = "model.safetensors.index.json"
ROPE_SCALING_TYPES = ("default", "linear", "llama3")


def read_hf_dir(path: Path, dtype: torch.dtype) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    config = read_hf_config(path)
    shapes = hf_weight_shapes(config)
    weights = read_safetensors(path, set(shapes), dtype)
    check_weights(path, shapes, weights)
    return config, weights, Tokenizer.from_hf_dir(path)


def read_hf_config(path: Path) -> ModelConfig:
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(path, "no config.json here: pass a Hugging Face model directory "
                                   "(config.json + *.safetensors) or a .gguf file")
    try:
        hf = json.loads(config_path.read_text())
    except (ValueError, OSError) as e:
        raise ModelLoadError(config_path, f"not valid JSON: {one_line(e)}") from None
    check_supported(hf, config_path)
    try:
        return ModelConfig.from_hf(hf)
    except KeyError as e:
        raise ModelLoadError(config_path, f"missing key {e.args[0]!r}") from None
    except (ConfigError, TypeError, ZeroDivisionError) as e:
        raise ModelLoadError(config_path, one_line(e)) from None


def check_supported(hf: dict, config_path: Path) -> None:
    """Refuse, by name, what our Llama-family model does not implement."""
    model_type = hf.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ModelLoadError(config_path, f"model_type {model_type!r} is not supported "
                                          f"(supported: {', '.join(ARCHITECTURES)})")
    if model_type != "qwen2" and (hf.get("attention_bias") or hf.get("mlp_bias")):
        raise ModelLoadError(config_path, "attention_bias/mlp_bias on a Llama-style model is not supported")
    scaling = hf.get("rope_scaling") or {}
    rope_type = scaling.get("rope_type") or scaling.get("type")
    if rope_type not in (None, *ROPE_SCALING_TYPES):
        raise ModelLoadError(config_path, f"rope_scaling type {rope_type!r} is not supported "
                                          f"(supported: {', '.join(ROPE_SCALING_TYPES)})")


def hf_weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter the model needs, by HF name, with its HF shape ([out_features, in_features] for linears)."""
    hidden, ffn, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    q_rows = config.num_attention_heads * config.head_dim
    kv_rows = config.num_key_value_heads * config.head_dim
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (vocab, hidden)
    for i in range(config.num_hidden_layers):
        layer = f"model.layers.{i}."
        shapes.update({
            layer + "self_attn.q_proj.weight": (q_rows, hidden),
            layer + "self_attn.k_proj.weight": (kv_rows, hidden),
            layer + "self_attn.v_proj.weight": (kv_rows, hidden),
            layer + "self_attn.o_proj.weight": (hidden, q_rows),
            layer + "mlp.gate_proj.weight": (ffn, hidden),
            layer + "mlp.up_proj.weight": (ffn, hidden),
            layer + "mlp.down_proj.weight": (hidden, ffn),
            layer + "input_layernorm.weight": (hidden,),
            layer + "post_attention_layernorm.weight": (hidden,),
        })
        if config.attention_bias:
            shapes.update({layer + "self_attn.q_proj.bias": (q_rows,),
                           layer + "self_attn.k_proj.bias": (kv_rows,),
                           layer + "self_attn.v_proj.bias": (kv_rows,)})
    return shapes


def check_weights(path: Path, shapes: dict[str, tuple[int, ...]], weights: dict[str, torch.Tensor],
                  file_name: Callable[[str], str] = str) -> None:
    """Raise ModelLoadError naming the first missing or misshapen tensor, in the file's own naming."""
    missing = [name for name in shapes if name not in weights]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelLoadError(path, f"missing tensor {file_name(missing[0])}{more}")
    for name, shape in shapes.items():
        if tuple(weights[name].shape) != shape:
            raise ModelLoadError(path, f"tensor {file_name(name)} has shape {list(weights[name].shape)}, "
                                       f"the config implies {list(shape)}")


def read_safetensors(path: Path, names: set[str], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors in `names` from every safetensors file of the checkpoint, cast to `dtype`; others are skipped."""
    weights = {}
    for file in safetensors_files(path):
        try:
            with safe_open(file, framework="pt") as reader:
                for name in reader.keys():
                    if name in names:
                        weights[name] = reader.get_tensor(name).to(dtype)
        except (SafetensorError, OSError, RuntimeError, ValueError) as e:
            raise ModelLoadError(file, f"cannot read safetensors file: {one_line(e)}") from None
    return weights


def safetensors_files(path: Path) -> list[Path]:
    index = path / SHARD_INDEX
    if not index.is_file():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(path, "no *.safetensors files (PyTorch .bin checkpoints are not supported)")
        return files
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, OSError, KeyError, TypeError) as e:
        raise ModelLoadError(index, f"not a valid shard index: {one_line(e)}") from None
    files = [path / name for name in sorted(set(weight_map.values()))]
    for file in files:
        if not file.is_file():
            raise ModelLoadError(file, f"shard listed in {SHARD_INDEX} is missing")
    return files
