"""Grouped paged attention (models/attention.py) against plain per-sequence softmax attention."""

import pytest
import torch

import threading

from specwise.models.attention import (AttentionMetadata, CachedGroup, PrefillChunk, attention, grouped_attention,
                                       step_metadata)


def test_value_bags_list_each_rows_context_slots_per_kv_head():
    group = CachedGroup(torch.tensor([0, 1]), torch.tensor([[3], [1]]), None, 1, block_size=2)
    indices, offsets = group.value_bags(num_kv_heads=1, num_slots=8, heads_per_kv=1)
    assert indices.tolist() == [6, 7, 2, 3]
    assert offsets.tolist() == [0, 2]
    indices, offsets = group.value_bags(num_kv_heads=2, num_slots=8, heads_per_kv=2)
    # (kv head, sequence, query head) order; kv head 1 reads slots 8 further on
    assert indices.view(-1, 2).tolist() == [[6, 7], [6, 7], [2, 3], [2, 3], [14, 15], [14, 15], [10, 11], [10, 11]]
    assert offsets.tolist() == [0, 2, 4, 6, 8, 10, 12, 14]


@pytest.mark.parametrize("q_len", [1, 2])     # decode (values summed in bags), several queries (a matmul)
def test_grouped_attention_matches_softmax_attention_per_sequence(q_len):
    torch.manual_seed(0)
    num_heads, num_kv_heads, head_dim, block_size, num_slots = 6, 2, 8, 4, 64
    key_cache = torch.randn(num_kv_heads, num_slots, head_dim)
    value_cache = torch.randn(num_kv_heads, num_slots, head_dim)
    block_tables = torch.tensor([[5, 2, 9], [7, 0, 0]])                 # 12 and 4 slots; the second padded
    starts = [9, 2]                                                        # query j sits at start + j
    context_len = 3 * block_size
    last_visible = torch.tensor(starts).view(-1, 1) + torch.arange(q_len)      # [G, q_len]
    visible = torch.arange(context_len).view(1, 1, -1) <= last_visible[..., None]
    bias = torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))
    query = torch.randn(2 * q_len, num_heads, head_dim)
    rows = torch.arange(2 * q_len).flip(0)                                 # rows out of order
    group = CachedGroup(rows, block_tables, bias, q_len, block_size)
    out = grouped_attention(query, key_cache, value_cache, group)

    for index, (table, start) in enumerate(zip(block_tables, starts)):
        slots = (table.view(-1, 1) * block_size + torch.arange(block_size)).view(-1)
        for j in range(q_len):
            row = group.rows[index * q_len + j]
            seen = slots[:start + j + 1]
            for head in range(num_heads):
                kv = head // (num_heads // num_kv_heads)
                weights = torch.softmax(key_cache[kv, seen] @ query[row, head] / head_dim ** 0.5, dim=0)
                expected = weights @ value_cache[kv, seen]
                got = out[index * q_len + j, head * head_dim:(head + 1) * head_dim]
                torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_block_rows_list_each_kv_heads_blocks():
    group = CachedGroup(torch.tensor([0, 1]), torch.tensor([[3], [1]]), None, 1, block_size=2)
    assert group.block_rows(num_kv_heads=2, num_cache_blocks=8).tolist() == [3, 1, 11, 9]


def test_attention_reads_the_steps_metadata_of_its_own_thread():
    query, key, value = torch.randn(3, 4, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    kv_cache = torch.zeros(1, 2, 2, 16, 8)                            # one layer, 16 slots
    with pytest.raises(RuntimeError, match="step_metadata"):
        attention(query, key, value, kv_cache, 0)
    errors = []
    with step_metadata(AttentionMetadata(torch.tensor([5, 6, 7]), [PrefillChunk(0, 3)], [])):
        out = attention(query, key, value, kv_cache, 0)
        thread = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, attention, query, key,
                                                                            value, kv_cache, 0)))
        thread.start()
        thread.join()
    assert out.shape == (3, 32) and len(errors) == 1
    torch.testing.assert_close(kv_cache[0, 0, :, 5:8], key.transpose(0, 1))      # written at the step's slots
    torch.testing.assert_close(kv_cache[0, 1, :, 5:8], value.transpose(0, 1))
