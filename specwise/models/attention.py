"""Paged attention over a flat batch of query tokens, in plain PyTorch.

The KV cache of one layer is [num_kv_heads, num_slots, head_dim] per side (keys, values);
slot = block_id * block_size + offset. A step's query tokens are flat: all sequences' tokens
in one row dimension [num_tokens, ...], so linear layers never compute padding (a prefill of
prompts of 47 and 315 tokens costs 362 tokens, not 2 x 315). The runner builds, once per step:

  slot_mapping  [num_tokens]  where each new token's K/V is written
  prefills      prompt chunks that start at position 0: their context is exactly their own new
                K/V, so they attend to it causally (SDPA's fused kernel), reading nothing back
  groups        every other sequence (decoding, verifying 1 + k drafts, a later prompt chunk)
                reads its context from the cache. Sequences with the same number of queries are
                sorted by context length and attended to in groups of up to GROUP_SIZE:

                  rows           [G * q_len]      the group's query rows in the flat batch; None when the
                                 group is the whole batch in row order (no copy in or out)
                  block_tables   [G, num_blocks]  each sequence's cache blocks, padded with block 0;
                                 context_len = num_blocks * block_size key positions (whole blocks:
                                 slicing the gathered keys to the longest context made the matmuls
                                 copy them, which cost more than the masked tail)
                  bias           [G, q_len, context_len] 0 where query j of sequence i may see the
                                 key (positions 0 .. start_i + j), -inf elsewhere (padding, future);
                                 None when nothing is masked

A group is one gather of its blocks' keys (whole blocks: block_size x head_dim values per
index, about twice as fast as gathering slot by slot), one batched matmul for the scores with
the query heads grouped by the KV head they share (no K/V repeat), softmax (in fp32 inside), then the
values. Decoding (one query a sequence) sums them in place with `embedding_bag`: each (KV head,
sequence, query head) is a bag of its context's value-cache rows weighted by the softmax, read
where they lie, never gathered (FBGEMM's fused kernel; engine decode steps 8% faster at batch
4, 16-20% at batch 16-64, context 150-450, than gathering the values for a second matmul).
With several queries a sequence (verification, a later prompt chunk) every bag would read each
value row again, so the values are gathered for a second matmul, which reads them once. Why
groups: per sequence, these ops are tiny (a few queries against a few hundred keys) and cost
their fixed ~30 us each; one op per group pays it once, and sorting by length keeps the
padding small. Measured on CPU (SmolLM2-135M, context 100-600): decode steps at batch 64 about
2x faster than one matmul pair per sequence, and SDPA was 5x slower than these matmuls in bf16
for one query (its fixed cost per call). The keys stay gathered: the scores as bags too (a
block-transposed key cache, 64 rows of 16 keys per block) needed 16x the indices and measured
no faster at batch 16 and 10% slower at batch 64.
Keys are read by position, so a rejected draft token's K/V is simply overwritten next step:
rollback costs nothing.
"""

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

GROUP_SIZE = 16


@dataclass
class PrefillChunk:
    start: int                      # rows [start, end) of the flat batch
    end: int


@dataclass
class CachedGroup:
    rows: torch.Tensor | None       # [G * q_len]; None: the group is the whole batch, rows in order
    block_tables: torch.Tensor      # [G, num_blocks]
    bias: torch.Tensor | None       # [G, q_len, num_blocks * block_size]
    q_len: int
    block_size: int
    # block_rows and value_bags, built at the first layer of a step and used by every layer
    indices: dict = field(default_factory=dict, repr=False)

    def block_rows(self, num_kv_heads: int, num_cache_blocks: int) -> torch.Tensor:
        """[kv_heads * G * num_blocks] rows of a cache (keys or values) viewed as [kv_heads * num_cache_blocks,
        block_size * head_dim]: one index_select over dim 0 gathers every KV head's blocks, on all threads
        (over dim 1 of [kv_heads, blocks, ...] PyTorch gathers on one thread: 2x slower on two cores).
        Example: block_tables [[3], [1]], two KV heads, 8 cache blocks: rows [3, 1, 11, 9]."""
        key = ("keys", num_kv_heads, num_cache_blocks)
        if key not in self.indices:
            heads = torch.arange(num_kv_heads, device=self.block_tables.device).view(-1, 1) * num_cache_blocks
            self.indices[key] = (heads + self.block_tables.view(1, -1)).view(-1)
        return self.indices[key]

    def value_bags(self, num_kv_heads: int, num_slots: int, heads_per_kv: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode (one query a sequence): embedding_bag indices [kv_heads * G * heads_per_kv * context_len] into
        the value cache viewed as [kv_heads * num_slots, head_dim], bag by bag in (kv head, sequence, query head)
        order, and bag offsets.
        Example: block_size 2, block_tables [[3], [1]], one KV head, one query head: bags [6, 7] and [2, 3]."""
        key = ("values", num_kv_heads, num_slots, heads_per_kv)
        if key not in self.indices:
            num_seqs, num_blocks = self.block_tables.shape
            slots = (self.block_tables.unsqueeze(-1) * self.block_size
                     + torch.arange(self.block_size, device=self.block_tables.device)).view(num_seqs, 1, -1)
            heads = torch.arange(num_kv_heads, device=slots.device).view(-1, 1, 1, 1) * num_slots
            indices = (heads + slots).expand(num_kv_heads, num_seqs, heads_per_kv, -1).reshape(-1)
            context_len = num_blocks * self.block_size
            self.indices[key] = indices, torch.arange(0, indices.numel(), context_len, device=slots.device)
        return self.indices[key]


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor      # [num_tokens]
    prefills: list[PrefillChunk]
    groups: list[CachedGroup]


# The step's metadata, set around a forward by whoever built it (`step_metadata`): the model's layers
# take only tensors, so a compiled forward sees attention as one opaque op (see `attention`) and one
# graph serves every step, whatever its prefills and groups. Per thread: engines stepped on two threads
# of one process (a server's step thread, a test's main thread) never see each other's step.
_local = threading.local()


@contextmanager
def step_metadata(metadata: AttentionMetadata):
    outer = getattr(_local, "metadata", None)
    _local.metadata = metadata
    try:
        yield
    finally:
        _local.metadata = outer


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
              layer: int) -> torch.Tensor:
    """Layer `layer`'s paged attention over the step's metadata. kv_cache [layers, 2, kv_heads, num_slots,
    head_dim], all layers: an op that mutates a view of it (one layer's keys) made inductor copy the whole
    cache in and out around every call. Eager code calls the function itself (the op's dispatch costs ~15 us)."""
    if torch.compiler.is_compiling():
        return torch.ops.specwise.paged_attention(query, key, value, kv_cache, layer)
    return _layer_attention(query, key, value, kv_cache, layer)


def _layer_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                     layer: int) -> torch.Tensor:
    metadata = getattr(_local, "metadata", None)
    if metadata is None:
        raise RuntimeError("attention outside a step: run the model inside `with step_metadata(metadata):`")
    num_tokens = metadata.slot_mapping.shape[0]
    if query.shape[0] == num_tokens:
        return paged_attention(query, key, value, kv_cache[layer], metadata)
    # rows past the step's tokens pad it to a compiled graph's size (compile/graphs.py): no slot, no attention
    output = query.new_zeros(query.shape[0], query.shape[1] * query.shape[2])
    output[:num_tokens] = paged_attention(query[:num_tokens], key[:num_tokens], value[:num_tokens], kv_cache[layer],
                                          metadata)
    return output


# Defined through torch.library.Library, not the `custom_op` decorator: the decorator's Python wrapper cost
# ~45 us a call inside the engine's compiled step (30 calls a step), the plain registration ~13 us.
_library = torch.library.Library("specwise", "DEF")
_library.define("paged_attention(Tensor query, Tensor key, Tensor value, Tensor(a!) kv_cache, int layer) -> Tensor")
_library.impl("paged_attention", _layer_attention, "CompositeExplicitAutograd")


@torch.library.register_fake("specwise::paged_attention")
def _(query, key, value, kv_cache, layer):
    return query.new_empty(query.shape[0], query.shape[1] * query.shape[2])


def paged_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                    metadata: AttentionMetadata) -> torch.Tensor:
    """query [num_tokens, heads, head_dim]; key/value [num_tokens, kv_heads, head_dim]; kv_cache, one
    layer's keys and values [2, kv_heads, num_slots, head_dim]. Returns [num_tokens, heads * head_dim]."""
    num_tokens, num_heads, head_dim = query.shape
    # both sides in one write, before any view of either is taken (autograd, when a drafter trains
    # through this, rejects a second in-place write through a view taken before the first)
    kv_cache.index_copy_(2, metadata.slot_mapping, torch.stack([key, value]).transpose(1, 2))
    key_cache, value_cache = kv_cache                                     # [kv_heads, num_slots, head_dim] each
    if metadata.groups and metadata.groups[0].rows is None:          # the one group is the whole batch
        return grouped_attention(query, key_cache, value_cache, metadata.groups[0])
    key, value = key.transpose(0, 1), value.transpose(0, 1)               # [kv_heads, num_tokens, head_dim]
    output = query.new_empty(num_tokens, num_heads * head_dim)
    for chunk in metadata.prefills:
        rows = slice(chunk.start, chunk.end)
        # 4-D inputs: SDPA's fused CPU kernel needs the batch dimension (3-D falls back to plain math)
        attended = F.scaled_dot_product_attention(query[rows].transpose(0, 1)[None], key[None, :, rows],
                                                  value[None, :, rows], enable_gqa=True,
                                                  is_causal=chunk.end - chunk.start > 1)[0]
        output[rows] = attended.transpose(0, 1).reshape(chunk.end - chunk.start, num_heads * head_dim)
    for group in metadata.groups:
        output.index_copy_(0, group.rows, grouped_attention(query, key_cache, value_cache, group))
    return output


def grouped_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      group: CachedGroup) -> torch.Tensor:
    """One group's attention: [G * q_len, heads * head_dim], rows in group.rows order (batch order if None).
    Head h reads KV head h // heads_per_kv (the GQA convention)."""
    num_heads, head_dim = query.shape[1:]
    num_kv_heads = key_cache.shape[0]
    heads_per_kv = num_heads // num_kv_heads
    num_seqs, num_blocks = group.block_tables.shape
    q_len, context_len = group.q_len, num_blocks * group.block_size
    queries = query if group.rows is None else query.index_select(0, group.rows)
    queries = queries.view(num_seqs, q_len, num_kv_heads, heads_per_kv, head_dim)
    queries = queries.permute(2, 0, 3, 1, 4).reshape(num_kv_heads * num_seqs, heads_per_kv * q_len, head_dim)
    # [kv_heads * G, context_len, head_dim] straight from the gather: the matmuls batch over (kv_heads, G), so the
    # gathered keys are never copied again into another layout. torch.bmm on 3-D views, not matmul on 4-D ones:
    # the same kernel, 10-50 us less a call at G 1-16 (matmul's batch folding)
    block_rows = group.block_rows(num_kv_heads, key_cache.shape[1] // group.block_size)
    keys = key_cache.view(-1, group.block_size * head_dim).index_select(0, block_rows)  # [kv_heads * G * blocks, ..]
    keys = keys.view(num_kv_heads * num_seqs, context_len, head_dim)
    scores = torch.bmm(queries, keys.transpose(1, 2))                     # [kv_heads * G, heads_per_kv * q_len, ctx]
    if group.bias is None:
        scores = scores.mul_(head_dim ** -0.5)
    else:   # bias + scale * scores in one op (the bias is 0 or -inf: the same numbers as scaling, then adding)
        shape = (num_kv_heads, num_seqs, heads_per_kv, q_len, context_len)
        scores = torch.add(group.bias[None, :, None], scores.view(shape), alpha=head_dim ** -0.5).view_as(scores)
    # PyTorch's CPU softmax computes a bf16 input in fp32 and rounds once: bitwise the same as dtype=float32 and
    # a cast back, one op fewer a layer
    weights = torch.softmax(scores, dim=-1)
    if q_len == 1:
        # decode: weights @ values without gathering the values; each (kv head, sequence, query head) is one bag
        # of its context's cache rows, summed with its weights (padding rows weigh 0)
        indices, offsets = group.value_bags(num_kv_heads, value_cache.shape[1], heads_per_kv)
        attended = F.embedding_bag(indices, value_cache.view(-1, head_dim), offsets, mode="sum",
                                   per_sample_weights=weights.view(-1))  # [kv_heads * G * heads_per_kv, d]
    else:   # several queries a sequence: the matmul reads each gathered value row once (3-5x faster than bags
            # from 9 queries on, as fast at 5)
        values = value_cache.view(-1, group.block_size * head_dim).index_select(0, block_rows)
        attended = torch.bmm(weights, values.view(num_kv_heads * num_seqs, context_len, head_dim))
    attended = attended.view(num_kv_heads, num_seqs, heads_per_kv, q_len, head_dim).permute(1, 3, 0, 2, 4)
    return attended.reshape(num_seqs * q_len, num_heads * head_dim)
