"""Paged attention in plain PyTorch.

The KV cache of one layer is a flat array of slots, [num_slots, num_kv_heads, head_dim];
slot = block_id * block_size + offset. The model runner turns block tables into two
index tensors, so this module never sees blocks:

  slot_mapping  [num_seqs, max_query_len]    where each new token's K/V is written
  context_slots [num_seqs, max_context_len]  the slots of every key position to attend to
  attn_mask     [num_seqs, 1, max_query_len, max_context_len] True = may attend, or None

Padding (ragged queries, shorter contexts) points at a scratch slot past the real blocks
and is masked out. Because keys are gathered by position, a rejected draft token's K/V
is simply overwritten next step: rollback costs nothing.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor
    context_slots: torch.Tensor
    attn_mask: torch.Tensor | None


def paged_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    key_cache: torch.Tensor, value_cache: torch.Tensor,
                    metadata: AttentionMetadata) -> torch.Tensor:
    """query [num_seqs, q_len, heads, head_dim]; key/value [num_seqs, q_len, kv_heads, head_dim].

    Returns [num_seqs, q_len, heads * head_dim].
    """
    num_seqs, q_len, num_heads, head_dim = query.shape
    flat_slots = metadata.slot_mapping.reshape(-1)                        # [num_seqs * q_len]
    key_cache[flat_slots] = key.reshape(-1, *key.shape[2:])
    value_cache[flat_slots] = value.reshape(-1, *value.shape[2:])
    # index_select, not cache[slots]: advanced indexing on a large cache is ~30x slower on CPU
    context_shape = (*metadata.context_slots.shape, *key_cache.shape[1:])
    flat_context = metadata.context_slots.reshape(-1)
    context_keys = key_cache.index_select(0, flat_context).view(context_shape)   # [num_seqs, ctx, kv_heads, head_dim]
    context_values = value_cache.index_select(0, flat_context).view(context_shape)
    output = F.scaled_dot_product_attention(
        query.transpose(1, 2),                                            # [num_seqs, heads, q_len, head_dim]
        context_keys.transpose(1, 2),                                     # [num_seqs, kv_heads, ctx, head_dim]
        context_values.transpose(1, 2),
        attn_mask=metadata.attn_mask,
        enable_gqa=True,
    )                                                                     # [num_seqs, heads, q_len, head_dim]
    return output.transpose(1, 2).reshape(num_seqs, q_len, num_heads * head_dim)
