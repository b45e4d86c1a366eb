"""Tiny randomly initialised Llama-family checkpoints built in-process (no files, no hub)."""

from pathlib import Path

import torch
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers

from specwise.models.checkpoints.loader import Checkpoint
from specwise.models.config import ModelConfig
from specwise.models.tokenizer import Tokenizer

SPECIAL_TOKENS = ["<s>", "</s>"]   # ids 256 and 257 after the 256 byte tokens


def byte_tokenizer() -> Tokenizer:
    """Byte-level tokenizer: ids 0..255 are bytes, 256 = BOS, 257 = EOS."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: index for index, symbol in enumerate(sorted(alphabet, key=lambda c: ord(c)))}
    backend = BackendTokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(SPECIAL_TOKENS)
    template = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}<s>assistant: {% endif %}")
    return Tokenizer(backend, bos_token_id=256, eos_token_ids=[257], add_bos=True,
                     chat_template=template, source="tiny")


def hf_config(arch: str = "llama", num_layers: int = 2, tie: bool = False, **overrides) -> dict:
    config = dict(model_type=arch, vocab_size=258, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-6,
                  tie_word_embeddings=tie, bos_token_id=256, eos_token_id=257)
    config.update(overrides)
    return config


def random_weights(config: ModelConfig, seed: int, scale: float = 0.5) -> dict[str, torch.Tensor]:
    """HF-named weights; a large init scale gives peaked, input-dependent next-token distributions."""
    generator = torch.Generator().manual_seed(seed)
    normal = lambda *shape: torch.randn(*shape, generator=generator) * scale / shape[-1] ** 0.5
    hidden, inter, head_dim = config.hidden_size, config.intermediate_size, config.head_dim
    q_size, kv_size = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    weights = {"model.embed_tokens.weight": torch.randn(config.vocab_size, hidden, generator=generator),
               "model.norm.weight": torch.ones(hidden)}
    for index in range(config.num_hidden_layers):
        prefix = f"model.layers.{index}."
        weights.update({
            prefix + "self_attn.q_proj.weight": normal(q_size, hidden) * 4,
            prefix + "self_attn.k_proj.weight": normal(kv_size, hidden) * 4,
            prefix + "self_attn.v_proj.weight": normal(kv_size, hidden),
            prefix + "self_attn.o_proj.weight": normal(hidden, q_size),
            prefix + "mlp.gate_proj.weight": normal(inter, hidden),
            prefix + "mlp.up_proj.weight": normal(inter, hidden),
            prefix + "mlp.down_proj.weight": normal(hidden, inter),
            prefix + "input_layernorm.weight": torch.ones(hidden),
            prefix + "post_attention_layernorm.weight": torch.ones(hidden),
        })
        if config.attention_bias:
            for name, size in (("q", q_size), ("k", kv_size), ("v", kv_size)):
                weights[prefix + f"self_attn.{name}_proj.bias"] = normal(size) * 0.1
    if not config.tie_word_embeddings:
        weights["lm_head.weight"] = torch.randn(config.vocab_size, hidden, generator=generator) * 2
    return weights


def tiny_checkpoint(arch: str = "llama", seed: int = 0, **overrides) -> Checkpoint:
    config = ModelConfig.from_hf(hf_config(arch, **overrides))
    return Checkpoint(config, random_weights(config, seed), byte_tokenizer(), Path(f"tiny-{arch}-{seed}"))
