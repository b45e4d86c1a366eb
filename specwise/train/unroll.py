"""Decoder layers run over padded sequences with every drafting chain at once, in plain tensors.

Training and the held-out measurement need, for every position t of a sequence, the chain the
engine would draft from there: k steps, each feeding back what the previous one predicted. In
the engine one chain attends to the true context 0..t in its paged cache plus its own
predicted entries. Here all chains of a batch run together:

  step 1   causal attention over the whole padded sequence: query c sees keys 0..c. Its keys
           and values are the "true" ones every chain shares.
  step j   one query per chain c (at position c + j - 1), seeing the true keys 0..c and the keys
           this chain wrote at steps 2..j (its own, one per step): scores against the true keys
           are one [C, L] matmul with a mask, against its own keys a per-chain dot product.
           Chains before `first_chain` (a prompt nobody drafts in) can be left out from step 2 on.

Worked example, chain c = 5 at step 3: keys true 0..5, own (step 2, position 6) and (step 3,
position 7): exactly the context the paged head has when it drafts its third token from
position 5. The layer's weights, norms and rope are the model's own modules, so what is trained
here is what the engine runs (tests/test_train.py checks the two against each other).
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from specwise.models.llama import DecoderLayer
from specwise.models.rope import RotaryEmbedding, apply_rotary


@dataclass
class LayerState:
    """What later steps of one layer read: the true K/V of step 1 and each chain's own K/V."""
    true_key: torch.Tensor | None = None      # [B, kv_heads, L, head_dim] (rope applied)
    true_value: torch.Tensor | None = None
    own_keys: list[torch.Tensor] = field(default_factory=list)     # per step >= 2: [B, kv_heads, C, head_dim]
    own_values: list[torch.Tensor] = field(default_factory=list)
    first_chain: int = 0        # steps >= 2 run chains first_chain .. (earlier ones are not needed)


def rope(rotary: RotaryEmbedding, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, C] -> cos, sin [B, C, 1, head_dim]."""
    cos, sin = rotary(positions.reshape(-1), dtype)
    return cos.view(*positions.shape, 1, -1), sin.view(*positions.shape, 1, -1)


def layer_step(layer: DecoderLayer, hidden: torch.Tensor, cos_sin, state: LayerState,
               attention_input: torch.Tensor | None = None) -> torch.Tensor:
    """hidden [B, C, hidden] -> [B, C, hidden]. The first call for `state` is step 1 (causal over the
    sequence, its K/V kept as the true ones); later calls are chain steps (one query per chain).
    attention_input: what q/k/v read instead of input_layernorm(hidden) (EAGLE-3's [2H]); hidden stays
    the residual."""
    attn = layer.self_attn
    batch, num_rows, _ = hidden.shape
    heads, kv_heads, head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    if attention_input is None:
        attention_input = layer.input_layernorm(hidden)
    query, key, value = attn.qkv_proj(attention_input).split([q_size, kv_size, kv_size], dim=-1)
    query = apply_rotary(query.view(batch, num_rows, heads, head_dim), *cos_sin).transpose(1, 2)
    key = apply_rotary(key.view(batch, num_rows, kv_heads, head_dim), *cos_sin).transpose(1, 2)
    value = value.view(batch, num_rows, kv_heads, head_dim).transpose(1, 2)     # [B, kv_heads, C, head_dim]
    if state.true_key is None:
        state.true_key, state.true_value = key, value
        attended = F.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)
    else:
        state.own_keys.append(key)
        state.own_values.append(value)
        attended = chain_attention(query, state)
    attended = attended.transpose(1, 2).reshape(batch, num_rows, q_size)
    hidden = hidden + attn.o_proj(attended)
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))


def chain_attention(query: torch.Tensor, state: LayerState) -> torch.Tensor:
    """query [B, heads, C, d]: row c is chain first_chain + c; it attends to true keys 0 .. first_chain + c
    and to its own keys -> [B, heads, C, d]."""
    batch, heads, chains, head_dim = query.shape
    kv_heads, length = state.true_key.shape[1], state.true_key.shape[2]
    group = heads // kv_heads                                          # query head h reads kv head h // group
    q = query.view(batch, kv_heads, group, chains, head_dim) * head_dim ** -0.5
    own_key = torch.stack(state.own_keys, dim=2)                       # [B, kv_heads, S, C, d]
    own_value = torch.stack(state.own_values, dim=2)
    true_scores = q @ state.true_key.unsqueeze(2).transpose(-1, -2)   # [B, kv_heads, group, C, L]
    visible = torch.arange(length, device=q.device) <= torch.arange(chains, device=q.device).unsqueeze(1) + \
        state.first_chain
    true_scores = true_scores.masked_fill(~visible, float("-inf"))
    own_scores = torch.einsum("bkgcd,bkscd->bkgcs", q, own_key)        # [B, kv_heads, group, C, S]
    weights = torch.softmax(torch.cat([true_scores, own_scores], dim=-1).float(), dim=-1).to(q.dtype)
    attended = weights[..., :length] @ state.true_value.unsqueeze(2)   # [B, kv_heads, group, C, d]
    attended = attended + torch.einsum("bkgcs,bkscd->bkgcd", weights[..., length:], own_value)
    return attended.reshape(batch, heads, chains, head_dim)
