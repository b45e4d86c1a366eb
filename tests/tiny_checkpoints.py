"""Tiny random checkpoints for tests: HF directories (config.json + safetensors + tokenizer) and GGUF files.

    config = make_tiny_hf_config("qwen2", tie=True)
    weights = random_state_dict(config, seed=0)
    write_hf_checkpoint(tmp_path / "hf", config, weights, shards=2)
    write_gguf_checkpoint(tmp_path / "m.gguf", config, weights, qtype="Q4_0")
"""

import functools
import json
import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import safetensors.torch
import tokenizers
import torch
from tokenizers import decoders, pre_tokenizers, trainers

from specwise.models.checkpoints.default_model import default_model_path
from specwise.models.checkpoints.hf import hf_weight_shapes
from specwise.models.config import ModelConfig

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]   # ids 0, 1, 2 as in SmolLM2
BOS_TOKEN, EOS_TOKEN = "<|im_start|>", "<|im_end|>"
TINY_VOCAB_SIZE = 400
# llama.cpp's tensor names, written out independently of the loader's mapping.
GGUF_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}
GGUF_GLOBAL_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away into the forest.",
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, 2 * i))\n",
    "Speculative decoding drafts several tokens and the target model verifies them in one forward pass.",
    "Numbers: 12345, 2024-06-01, 3.14159 and 1000000 items cost $42.50 in total.",
    "Unicode: café, naïve, Zürich, 東京, emoji 🙂 and the em dash — all together.",
    "She said: \"It's what they'll do, isn't it?\" and we're sure you've seen it.",
]


@pytest.fixture(scope="session")
def real_model_path() -> Path:
    """The real default model (SmolLM2-135M-Instruct GGUF), fetched once into $SPECWISE_CACHE; integration only."""
    return default_model_path()


@functools.cache
def tiny_tokenizer(digits_split: bool = False) -> tokenizers.Tokenizer:
    """Byte-level BPE trained on CORPUS (deterministic); `digits_split` pre-splits digits as SmolLM2 does."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                               if digits_split else byte_level)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY_VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    assert tokenizer.get_vocab_size() == TINY_VOCAB_SIZE
    return tokenizer


def make_tiny_hf_config(arch: str = "llama", tie: bool = False, **overrides) -> dict:
    """A HF config.json dict for a 2-layer model with GQA (4 query heads, 2 KV heads, head_dim 16)."""
    class_names = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
    config = {
        "model_type": arch, "architectures": [class_names.get(arch, "UnknownForCausalLM")],
        "vocab_size": TINY_VOCAB_SIZE, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": 256, "tie_word_embeddings": tie, "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "float32",
    }
    config.update(overrides)
    return config


def random_state_dict(hf_config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every HF parameter of the config (lm_head omitted when tied), float32 ~ N(0, 1)."""
    generator = torch.Generator().manual_seed(seed)
    shapes = hf_weight_shapes(ModelConfig.from_hf(hf_config))
    return {name: torch.randn(shape, generator=generator) for name, shape in shapes.items()}


def write_hf_checkpoint(directory, hf_config: dict, state_dict: dict[str, torch.Tensor], shards: int = 1) -> Path:
    """config.json, model.safetensors (or `shards` files + model.safetensors.index.json), tokenizer files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2))
    if shards == 1:
        safetensors.torch.save_file(state_dict, directory / "model.safetensors", metadata={"format": "pt"})
    else:
        _write_shards(directory, state_dict, shards)
    tiny_tokenizer().save(str(directory / "tokenizer.json"))
    settings = {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "chat_template": CHATML_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    return directory


def _write_shards(directory: Path, state_dict: dict[str, torch.Tensor], shards: int) -> None:
    names = list(state_dict)
    weight_map = {}
    for shard in range(shards):
        file = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: state_dict[name] for name in names[shard::shards]}
        safetensors.torch.save_file(part, directory / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    total = sum(t.numel() * t.element_size() for t in state_dict.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter on Llama q/k rows: per head, halves (r0..r7 | r8..r15) -> pairs (r0 r8 r1 r9 ..)."""
    return weight.reshape(heads, 2, -1, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_tensor_name(hf_name: str) -> str:
    stem, _, suffix = hf_name.rpartition(".")
    if stem.startswith("model.layers."):
        _, _, layer, part = stem.split(".", 3)
        return f"blk.{layer}.{GGUF_LAYER_NAMES[part]}.{suffix}"
    return f"{GGUF_GLOBAL_NAMES[stem]}.{suffix}"


def gguf_tensor_data(hf_name: str, weight: torch.Tensor, hf_config: dict) -> np.ndarray:
    """The float32 array llama.cpp would store for this HF tensor (q/k rows permuted for Llama)."""
    data = weight.float().numpy()
    if hf_config["model_type"] in ("llama", "mistral"):
        heads = {"q_proj": hf_config["num_attention_heads"], "k_proj": hf_config["num_key_value_heads"]}
        for proj, count in heads.items():
            if f".self_attn.{proj}." in hf_name:
                return llama_cpp_permute(data, count)
    return data


def write_gguf_checkpoint(path, hf_config: dict, state_dict: dict[str, torch.Tensor], qtype: str = "F32",
                          pre: str = "gpt2", architecture: str | None = None,
                          tensor_qtypes: dict[str, str] | None = None) -> Path:
    """A GGUF file as llama.cpp's converter writes one: 2-D tensors in `qtype` (1-D always F32), Llama q/k
    permuted, tokenizer metadata. `tensor_qtypes` (HF name -> type) overrides single tensors; types the gguf
    package cannot quantize are written as zero blocks."""
    path = Path(path)
    arch = architecture or ("qwen2" if hf_config["model_type"] == "qwen2" else "llama")
    writer = gguf.GGUFWriter(path, arch)
    _add_model_metadata(writer, hf_config)
    _add_tokenizer_metadata(writer, pre)
    for name, weight in state_dict.items():
        data = gguf_tensor_data(name, weight, hf_config)
        kind = (tensor_qtypes or {}).get(name) or (qtype if data.ndim == 2 else "F32")
        _add_tensor(writer, gguf_tensor_name(name), data, gguf.GGMLQuantizationType[kind])
    if (hf_config.get("rope_scaling") or {}).get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_freq_factors(hf_config))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_tensor(writer: gguf.GGUFWriter, name: str, data: np.ndarray, qtype: gguf.GGMLQuantizationType) -> None:
    if qtype == gguf.GGMLQuantizationType.F32:
        writer.add_tensor(name, data)
    elif qtype == gguf.GGMLQuantizationType.F16:
        writer.add_tensor(name, data.astype(np.float16))
    else:
        try:
            raw = gguf.quants.quantize(data, qtype)
        except (NotImplementedError, gguf.quants.QuantError):
            raw = np.zeros(gguf.quants.quant_shape_to_byte_shape(data.shape, qtype), dtype=np.uint8)
        writer.add_tensor(name, raw, raw_dtype=qtype)


def _add_model_metadata(writer: gguf.GGUFWriter, hf_config: dict) -> None:
    heads = hf_config["num_attention_heads"]
    writer.add_block_count(hf_config["num_hidden_layers"])
    writer.add_context_length(hf_config["max_position_embeddings"])
    writer.add_embedding_length(hf_config["hidden_size"])
    writer.add_feed_forward_length(hf_config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(hf_config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(hf_config["rms_norm_eps"])
    writer.add_rope_freq_base(hf_config["rope_theta"])
    writer.add_rope_dimension_count(hf_config.get("head_dim") or hf_config["hidden_size"] // heads)
    writer.add_vocab_size(hf_config["vocab_size"])
    scaling = hf_config.get("rope_scaling") or {}
    if scaling.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(scaling["factor"])


def tiny_gguf_tokenizer_metadata(pre: str = "gpt2") -> dict:
    """The tokenizer.* GGUF metadata llama.cpp's converter writes for tiny_tokenizer(), as decoded values."""
    tokenizer = tiny_tokenizer(digits_split=pre == "smollm")
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3 if token in SPECIAL_TOKENS else 1 for token in tokens],
        "tokenizer.ggml.merges": [m if isinstance(m, str) else " ".join(m) for m in merges],
        "tokenizer.ggml.bos_token_id": vocab[BOS_TOKEN],
        "tokenizer.ggml.eos_token_id": vocab[EOS_TOKEN],
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML_TEMPLATE,
    }


def _add_tokenizer_metadata(writer: gguf.GGUFWriter, pre: str) -> None:
    metadata = tiny_gguf_tokenizer_metadata(pre)
    writer.add_tokenizer_model(metadata["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(metadata["tokenizer.ggml.tokens"])
    writer.add_token_types(metadata["tokenizer.ggml.token_type"])
    writer.add_token_merges(metadata["tokenizer.ggml.merges"])
    writer.add_bos_token_id(metadata["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(metadata["tokenizer.ggml.eos_token_id"])
    writer.add_add_bos_token(metadata["tokenizer.ggml.add_bos_token"])
    writer.add_chat_template(metadata["tokenizer.chat_template"])


def llama3_freq_factors(hf_config: dict) -> np.ndarray:
    """llama.cpp's rope_freqs.weight for a llama3 rope_scaling: what each rotary frequency is divided by."""
    scaling = hf_config["rope_scaling"]
    head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // hf_config["num_attention_heads"]
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    factors = []
    for i in range(0, head_dim, 2):
        wavelength = 2 * math.pi * hf_config["rope_theta"] ** (i / head_dim)
        if wavelength < original / high:
            factors.append(1.0)
        elif wavelength > original / low:
            factors.append(factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)
