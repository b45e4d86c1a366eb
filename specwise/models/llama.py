"""Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM2) over a paged KV cache.

q/k/v and gate/up projections are fused at load time (`load_weights`) from the HF
parameter names, so the model runs two matmuls where HF runs five.
"""

import torch
import torch.nn.functional as F
from torch import nn

from specwise.models.attention import attention
from specwise.models.config import ModelConfig
from specwise.models.rope import RotaryEmbedding, apply_rotary


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # HF normalizes in fp32, rounds to x's dtype, then scales: F.rms_norm computes a bf16 input in fp32
        # and rounds once, the same numbers (the weight inside it would scale before rounding: not the same)
        return self.weight * F.rms_norm(x, (x.shape[-1],), eps=self.eps)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        self.layer_index = layer_index              # which layer of the KV cache is its own
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        qkv_size = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, qkv_size, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: torch.Tensor) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        qkv = self.qkv_proj(hidden)                                         # [num_tokens, q_size + 2 * kv_size]
        # the query and key heads rotate together: one rotation's ops instead of two
        query_key = apply_rotary(qkv[:, :q_size + kv_size].view(num_tokens, -1, self.head_dim), *rope)
        query, key = query_key.split([self.num_heads, self.num_kv_heads], dim=1)
        value = qkv[:, q_size + kv_size:].view(num_tokens, self.num_kv_heads, self.head_dim)
        return self.o_proj(attention(query, key, value, kv_cache, self.layer_index))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(hidden).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, hidden, rope, kv_cache):
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), rope, kv_cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, max_positions: int | None = None):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, index) for index in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryEmbedding(config.head_dim, max_positions or config.max_position_embeddings,
                                      config.rope_theta, config.rope_scaling)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                num_layers: int | None = None, residuals: dict[int, torch.Tensor | None] | None = None) -> torch.Tensor:
        """input_ids, positions [num_tokens] (flat, see attention.py) -> final-normed hidden states
        [num_tokens, hidden]. kv_cache [layers, 2, kv_heads, num_slots, head_dim]; the step's attention
        metadata is set around the call (`with step_metadata(metadata):`).

        `num_layers` runs only the first layers (self-speculative drafting). `residuals` (EAGLE-3): for each
        layer id L among its keys, the residual stream after the first L layers ([num_tokens, hidden], L = 0
        the embeddings) is stored under L.
        """
        hidden = self.embed_tokens(input_ids)
        rope = self.rotary(positions, hidden.dtype)
        if residuals is not None and 0 in residuals:
            residuals[0] = hidden
        for index, layer in enumerate(self.layers[:num_layers]):
            hidden = layer(hidden, rope, kv_cache)
            if residuals is not None and index + 1 in residuals:
                residuals[index + 1] = hidden
        return self.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [num_rows, hidden] -> logits [num_rows, vocab_size] in fp32."""
        return self.lm_head(hidden).float()

    @torch.no_grad()
    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy HF-named tensors in, fusing q/k/v and gate/up."""
        fused = dict(weights)
        for index in range(self.config.num_hidden_layers):
            prefix = f"model.layers.{index}."
            for suffix in ("weight", "bias"):
                parts = [fused.pop(f"{prefix}self_attn.{name}_proj.{suffix}", None) for name in "qkv"]
                if parts[0] is not None:
                    fused[f"{prefix}self_attn.qkv_proj.{suffix}"] = torch.cat(parts)
            gate, up = (fused.pop(f"{prefix}mlp.{name}_proj.weight") for name in ("gate", "up"))
            fused[f"{prefix}mlp.gate_up_proj.weight"] = torch.cat([gate, up])
        renamed = {name.removeprefix("model."): tensor for name, tensor in fused.items()}
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight      # re-tie: to_empty() unties shared params
            renamed["lm_head.weight"] = renamed["embed_tokens.weight"]
        missing, unexpected = self.load_state_dict(renamed, strict=False)
        if missing or unexpected:
            raise KeyError(f"weights do not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
