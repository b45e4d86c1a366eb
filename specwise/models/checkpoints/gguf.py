"""Read a GGUF file: metadata to ModelConfig, tensors dequantized and renamed to HF names, and its tokenizer."""

import math
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import dequantize as gguf_dequantize

from specwise.errors import ConfigError, ModelLoadError
from specwise.models.checkpoints.hf import check_weights, hf_weight_shapes
from specwise.models.config import ModelConfig
from specwise.models.tokenizer import Tokenizer, one_line

Q = GGMLQuantizationType
# Types read by our own vectorised numpy code; the gguf package dequantizes the rest of READABLE_TYPES.
FAST_TYPES = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1)
READABLE_TYPES = FAST_TYPES + (Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)
# llama.cpp writes Mistral and SmolLM checkpoints as "llama".
GGUF_ARCHITECTURES = ("llama", "qwen2")
GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}


def read_gguf(path: Path, dtype: torch.dtype) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    reader = open_gguf(path)
    metadata = read_metadata(reader, path)
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    config = gguf_config(metadata, tensors, path)
    shapes = hf_weight_shapes(config)
    weights = {}
    for gguf_name, tensor in tensors.items():
        name = hf_name(gguf_name)
        if name in shapes:
            weights[name] = unpermute_if_llama(name, dequantize(tensor, dtype, path), config)
    check_weights(path, shapes, weights, file_name=gguf_name_of)
    return config, weights, Tokenizer.from_gguf(metadata, str(path))


class PlainArrayReader(GGUFReader):
    """GGUFReader over a plain ndarray view of its memmap: slicing np.memmap costs ~3x more per metadata item
    (a 49k-token vocabulary is ~250k slices)."""

    def _get(self, *args, **kwargs):
        if type(self.data) is np.memmap:
            self.data = self.data.view(np.ndarray)
        return super()._get(*args, **kwargs)


def open_gguf(path: Path) -> GGUFReader:
    try:
        return PlainArrayReader(path)
    except Exception as e:  # the gguf package raises ValueError, IndexError, ... for damaged files
        raise ModelLoadError(path, f"not a readable GGUF file ({one_line(e)})") from None


def read_metadata(reader: GGUFReader, path: Path) -> dict:
    metadata = {}
    for key, field in reader.fields.items():
        try:
            metadata[key] = field.contents()
        except (UnicodeDecodeError, ValueError, IndexError) as e:
            raise ModelLoadError(path, f"GGUF metadata {key} is unreadable ({one_line(e)})") from None
    if metadata.get("split.count", 1) > 1:
        raise ModelLoadError(path, "split GGUF files are not supported; merge them with `llama-gguf-split --merge`")
    return metadata


def gguf_config(metadata: dict, tensors: dict[str, ReaderTensor], path: Path) -> ModelConfig:
    arch = metadata.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(path, f"GGUF architecture {arch!r} is not supported (supported: llama, qwen2)")

    def value(key, default=KeyError):
        found = metadata.get(f"{arch}.{key}", default)
        if found is KeyError:
            raise ModelLoadError(path, f"GGUF metadata lacks {arch}.{key}")
        # GGUF floats are float32: 1e-6 reads back as 9.99999997e-07; keep the shortest decimal that round-trips.
        return float(str(np.float32(found))) if isinstance(found, float) else found

    heads, hidden = value("attention.head_count"), value("embedding_length")
    head_dim = value("attention.key_length", 0) or hidden // heads
    if value("rope.dimension_count", head_dim) != head_dim:
        raise ModelLoadError(path, "partial rotary embeddings (rope.dimension_count < head size) are not supported")
    eos = metadata.get("tokenizer.ggml.eos_token_id")
    fields = dict(
        architecture=arch,
        vocab_size=vocab_size(metadata, arch, tensors),
        hidden_size=hidden,
        intermediate_size=value("feed_forward_length"),
        num_hidden_layers=value("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=value("attention.head_count_kv", heads),
        head_dim=head_dim,
        rms_norm_eps=value("attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=value("rope.freq_base", 10000.0),
        max_position_embeddings=value("context_length", 2048),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=[] if eos is None else [eos],
    )
    fields["rope_scaling"] = rope_scaling(metadata, arch, tensors, head_dim, fields["rope_theta"], path)
    try:
        return ModelConfig(**fields)
    except (ConfigError, TypeError) as e:
        raise ModelLoadError(path, f"GGUF metadata does not describe a model specwise can run: {one_line(e)}") from None


def vocab_size(metadata: dict, arch: str, tensors: dict[str, ReaderTensor]) -> int:
    """Rows of the embedding (GGUF dims are [hidden, vocab]), else the metadata's count."""
    if "token_embd.weight" in tensors and len(tensors["token_embd.weight"].shape) == 2:
        return int(tensors["token_embd.weight"].shape[1])
    return metadata.get(f"{arch}.vocab_size") or len(metadata.get("tokenizer.ggml.tokens", []))


def rope_scaling(metadata: dict, arch: str, tensors: dict[str, ReaderTensor], head_dim: int,
                 rope_theta: float, path: Path) -> dict | None:
    """HF rope_scaling from GGUF: rope.scaling.* keys, or Llama 3.1's per-frequency factors in rope_freqs.weight."""
    kind = metadata.get(f"{arch}.rope.scaling.type", "none")
    factor = metadata.get(f"{arch}.rope.scaling.factor")
    if kind == "linear" and factor:
        return {"rope_type": "linear", "factor": factor}
    if kind not in ("none", "linear"):
        raise ModelLoadError(path, f"rope scaling type {kind!r} is not supported (supported: linear, llama3)")
    if "rope_freqs.weight" in tensors:
        freq_factors = dequantize(tensors["rope_freqs.weight"], torch.float64, path).numpy()
        scaling = llama3_rope_scaling(freq_factors, head_dim, rope_theta)
        if scaling is None:
            raise ModelLoadError(path, "rope_freqs.weight does not follow Llama 3 rope scaling; cannot convert it")
        return scaling
    return None


def llama3_rope_scaling(freq_factors: np.ndarray, head_dim: int, rope_theta: float) -> dict | None:
    """Recover HF's llama3 rope_scaling dict from llama.cpp's per-frequency divisors, or None if they don't fit.

    Llama 3.1 divides rotary frequency f by 1 where its wavelength is short, by `factor` where it is long, and in
    between by 1 / ((1 - s) / factor + s) with s = a / wavelength - b, where
    a = original_max_position_embeddings / (high_freq_factor - low_freq_factor) and
    b = low_freq_factor / (high_freq_factor - low_freq_factor). Only (factor, a, b) matter, so low_freq_factor = 1
    is a faithful choice: Llama 3.1's (8, 1, 4, 8192) gives a = 8192/3, b = 1/3 and comes back unchanged.
    """
    factor = float(freq_factors.max())
    inverse_wavelength = rope_theta ** (-np.arange(0, head_dim, 2) / head_dim) / (2 * math.pi)
    blend = (freq_factors > 1 + 1e-6) & (freq_factors < factor - 1e-6)
    if factor <= 1 or blend.sum() < 2 or len(freq_factors) != len(inverse_wavelength):
        return None
    s = (1 / freq_factors[blend] - 1 / factor) / (1 - 1 / factor)
    a, minus_b = np.polyfit(inverse_wavelength[blend], s, 1)
    if -minus_b <= 0:
        return None
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
               "high_freq_factor": float(1 - 1 / minus_b), "original_max_position_embeddings": round(a / -minus_b)}
    smooth = np.clip(a * inverse_wavelength + minus_b, 0.0, 1.0)
    if not np.allclose(1 / ((1 - smooth) / factor + smooth), freq_factors, rtol=1e-3):
        return None
    return scaling


def hf_name(gguf_name: str) -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight'; None for tensors HF has no name for."""
    stem, _, suffix = gguf_name.rpartition(".")
    if stem.startswith("blk."):
        _, layer, part = stem.split(".", 2)
        return f"model.layers.{layer}.{LAYER_NAMES[part]}.{suffix}" if part in LAYER_NAMES else None
    return f"{GLOBAL_NAMES[stem]}.{suffix}" if stem in GLOBAL_NAMES else None


def gguf_name_of(name: str) -> str:
    """The inverse of hf_name, for error messages."""
    stem, _, suffix = name.rpartition(".")
    if stem.startswith("model.layers."):
        _, _, layer, part = stem.split(".", 3)
        return f"blk.{layer}.{next(g for g, h in LAYER_NAMES.items() if h == part)}.{suffix}"
    return f"{next(g for g, h in GLOBAL_NAMES.items() if h == stem)}.{suffix}"


def unpermute_if_llama(name: str, weight: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (Llama arch only; Qwen2 GGUFs keep HF's order).

    Per head, llama.cpp stores rows as interleaved pairs (r0, r8, r1, r9, ... for head_dim 16) for its
    rotate-adjacent rope; HF keeps the two halves apart (r0..r7, r8..r15) for rotate-half.
    """
    if config.architecture != "llama":
        return weight
    if ".self_attn.q_proj." in name:
        heads = config.num_attention_heads
    elif ".self_attn.k_proj." in name:
        heads = config.num_key_value_heads
    else:
        return weight
    return weight.reshape(heads, -1, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape).contiguous()


def dequantize(tensor: ReaderTensor, dtype: torch.dtype, path: Path) -> torch.Tensor:
    """A GGUF tensor as a torch tensor in HF's shape (GGUF lists dims innermost first) and `dtype`."""
    qtype = tensor.tensor_type
    if qtype not in READABLE_TYPES:
        names = ", ".join(t.name for t in READABLE_TYPES)
        raise ModelLoadError(path, f"tensor {tensor.name} has type {qtype.name}, which specwise cannot read "
                                   f"(readable: {names})")
    shape = tuple(reversed([int(d) for d in tensor.shape]))
    data = np.array(tensor.data)
    if qtype == Q.BF16:
        return torch.from_numpy(data.view(np.int16)).view(torch.bfloat16).reshape(shape).to(dtype)
    values = _dequantize_fast(data, qtype) if qtype in FAST_TYPES else gguf_dequantize(data, qtype)
    return torch.from_numpy(values).reshape(shape).to(dtype)


def _dequantize_fast(data: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """ggml blocks of 32 values: Q8_0 = f16 d, 32 x int8 q (x = d*q); Q4_0 = f16 d, 16 bytes of nibbles
    (x = d*(q-8)); Q4_1 = f16 d, f16 m, nibbles (x = d*q + m). Low nibbles are values 0-15, high ones 16-31."""
    if qtype in (Q.F32, Q.F16):
        return data
    blocks = data.reshape(-1, {Q.Q8_0: 34, Q.Q4_0: 18, Q.Q4_1: 20}[qtype])
    scale = _halves(blocks, 0)
    if qtype == Q.Q8_0:
        return scale * blocks[:, 2:].copy().view(np.int8)
    nibbles = blocks[:, 4:] if qtype == Q.Q4_1 else blocks[:, 2:]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=1)
    if qtype == Q.Q4_0:
        return scale * (q.astype(np.float32) - 8)
    return scale * q + _halves(blocks, 2)


def _halves(blocks: np.ndarray, start: int) -> np.ndarray:
    """The f16 at byte `start` of every block, as float32 [num_blocks, 1]."""
    return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32)
