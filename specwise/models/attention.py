"""Paged attention over a flat batch of query tokens, in plain PyTorch.

The KV cache of one layer is [num_kv_heads, num_slots, head_dim] per side (keys, values);
slot = block_id * block_size + offset, so a sequence's keys are gathered head-major and
contiguous. A step's query tokens are flat: all sequences' tokens in one row dimension
[num_tokens, ...], so linear layers never compute padding (a prefill of prompts of 47 and
315 tokens costs 362 tokens, not 2 x 315). The runner builds, once per step:

  slot_mapping  [num_tokens]   where each new token's K/V is written
  seqs          per sequence: its rows [start, end) of the flat batch and how it attends:
                  - a prompt chunk from position 0 sees exactly its own new K/V, causally:
                    attention runs on them directly, nothing is read back from the cache;
                  - otherwise it reads its context from the cache (context_slots [context_len])
                    and, with several queries (a later chunk, or 1 + k when verifying drafts),
                    a bias [q_len, context_len]: 0 where query j (at position p_j) may see the
                    key (keys 0 .. p_j), -inf elsewhere.

Reading the cache, a sequence's few queries meet its whole context: two batched matmuls with
the query heads grouped by the KV head they share (no K/V repeat). Measured on CPU against
SDPA at context 300: equal in fp32, 5x faster in bf16 for one query (SDPA's fused CPU kernel
pays a fixed cost per call that a handful of queries never earns back). A fresh prompt chunk
has as many queries as keys: there SDPA's fused causal kernel is the right tool.

Each sequence attends to its own context only (no padding to the longest context in the
batch: measured 1.4-2.7x faster than the padded batched form at batch 4-64 on CPU). Keys are
read by position, so a rejected draft token's K/V is simply overwritten next step: rollback
costs nothing.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class SeqAttention:
    start: int                              # first row of the sequence's queries in the flat batch
    end: int
    context_slots: torch.Tensor | None      # [context_len] slots to read, or None: attend to the new K/V
    bias: torch.Tensor | None               # [q_len, context_len] 0 = may attend, -inf = may not; None: all


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor              # [num_tokens]
    seqs: list[SeqAttention]


def paged_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    key_cache: torch.Tensor, value_cache: torch.Tensor,
                    metadata: AttentionMetadata) -> torch.Tensor:
    """query [num_tokens, heads, head_dim]; key/value [num_tokens, kv_heads, head_dim];
    caches [kv_heads, num_slots, head_dim]. Returns [num_tokens, heads * head_dim]."""
    num_tokens, num_heads, head_dim = query.shape
    key, value = key.transpose(0, 1), value.transpose(0, 1)               # [kv_heads, num_tokens, head_dim]
    key_cache.index_copy_(1, metadata.slot_mapping, key)
    value_cache.index_copy_(1, metadata.slot_mapping, value)
    outputs = []
    for seq in metadata.seqs:
        queries = query[seq.start:seq.end].transpose(0, 1)               # [heads, q_len, head_dim]
        if seq.context_slots is None:                                     # whole context is new: causal
            # 4-D inputs: SDPA's fused CPU kernel needs the batch dimension (3-D falls back to plain math)
            output = F.scaled_dot_product_attention(queries[None], key[None, :, seq.start:seq.end],
                                                    value[None, :, seq.start:seq.end], enable_gqa=True,
                                                    is_causal=seq.end - seq.start > 1)[0]
        else:
            keys = key_cache.index_select(1, seq.context_slots)           # [kv_heads, context_len, head_dim]
            values = value_cache.index_select(1, seq.context_slots)
            output = grouped_attention(queries, keys, values, seq.bias)
        outputs.append(output.transpose(0, 1).reshape(seq.end - seq.start, num_heads * head_dim))
    return torch.cat(outputs)


def grouped_attention(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      bias: torch.Tensor | None) -> torch.Tensor:
    """queries [heads, q_len, head_dim]; keys/values [kv_heads, context_len, head_dim]; bias as above.
    Head h reads KV head h // group (group = heads / kv_heads). Returns [heads, q_len, head_dim]."""
    num_heads, q_len, head_dim = queries.shape
    num_kv_heads, context_len, _ = keys.shape
    group = num_heads // num_kv_heads
    grouped = queries.reshape(num_kv_heads, group * q_len, head_dim)     # rows: (head in group, query)
    scores = torch.bmm(grouped, keys.transpose(1, 2)) * head_dim ** -0.5  # [kv_heads, group * q_len, context_len]
    if bias is not None:
        scores = (scores.view(num_kv_heads, group, q_len, context_len) + bias).view_as(scores)
    weights = torch.softmax(scores.float(), dim=-1).to(values.dtype)     # softmax in fp32 also for bf16
    return torch.bmm(weights, values).view(num_heads, q_len, head_dim)
