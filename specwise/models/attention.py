"""Paged attention over a flat batch of query tokens, in plain PyTorch.

The KV cache of one layer is a flat array of slots, [num_slots, num_kv_heads, head_dim];
slot = block_id * block_size + offset. A step's query tokens are flat: all sequences'
tokens in one row dimension, [num_tokens, ...], sequence i owning rows
[query_start[i], query_start[i] + query_len[i]). The model runner turns block tables into
index tensors, so this module never sees blocks:

  slot_mapping   [num_tokens]              where each new token's K/V is written
  query_index    [num_seqs, max_query_len] flat row of each sequence's j-th query (padding -> num_tokens,
                                           a zero row), or None when every sequence has one query
  context_slots  [num_seqs, max_context_len] the slots of every key position to attend to
  attn_mask      [num_seqs, 1, max_query_len, max_context_len] True = may attend, or None
  token_index    [num_tokens]              row of each flat token in the [num_seqs * max_query_len] layout

Linear layers see only the flat tokens (a prefill of prompts of 47 and 315 tokens costs
362 tokens, not 2 x 315). Attention groups each sequence's queries with its own keys;
keys past a sequence's context point at a scratch slot and are masked out. Because keys
are read by position, a rejected draft token's K/V is simply overwritten next step:
rollback costs nothing.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor
    query_index: torch.Tensor | None
    context_slots: torch.Tensor
    attn_mask: torch.Tensor | None
    token_index: torch.Tensor | None


def paged_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    key_cache: torch.Tensor, value_cache: torch.Tensor,
                    metadata: AttentionMetadata) -> torch.Tensor:
    """query [num_tokens, heads, head_dim]; key/value [num_tokens, kv_heads, head_dim].

    Returns [num_tokens, heads * head_dim].
    """
    num_tokens, num_heads, head_dim = query.shape
    key_cache.index_copy_(0, metadata.slot_mapping, key)
    value_cache.index_copy_(0, metadata.slot_mapping, value)
    num_seqs, max_context_len = metadata.context_slots.shape
    if metadata.query_index is None:                                      # one query per sequence
        queries = query.unsqueeze(1)                                      # [num_seqs, 1, heads, head_dim]
    else:
        padded = torch.cat([query, query.new_zeros(1, num_heads, head_dim)])
        queries = padded[metadata.query_index]                            # [num_seqs, max_q, heads, head_dim]
    # index_select, not cache[slots]: advanced indexing on a large cache is ~30x slower on CPU
    context_shape = (num_seqs, max_context_len, *key_cache.shape[1:])
    flat_context = metadata.context_slots.reshape(-1)
    context_keys = key_cache.index_select(0, flat_context).view(context_shape)   # [num_seqs, ctx, kv_heads, head_dim]
    context_values = value_cache.index_select(0, flat_context).view(context_shape)
    output = F.scaled_dot_product_attention(
        queries.transpose(1, 2),                                          # [num_seqs, heads, max_q, head_dim]
        context_keys.transpose(1, 2),                                     # [num_seqs, kv_heads, ctx, head_dim]
        context_values.transpose(1, 2),
        attn_mask=metadata.attn_mask,
        enable_gqa=True,
    )                                                                     # [num_seqs, heads, max_q, head_dim]
    output = output.transpose(1, 2).reshape(-1, num_heads * head_dim)     # [num_seqs * max_q, heads * head_dim]
    return output if metadata.token_index is None else output[metadata.token_index]
