"""Paged KV-cache bookkeeping: allocate / trim / free, and free + used = total throughout."""

import random

import pytest

from specwise.engine.block_manager import BlockManager
from specwise.engine.sequence import Sequence
from specwise.sampling_params import SamplingParams


def seq_of(length: int) -> Sequence:
    return Sequence("r", list(range(length)), SamplingParams())


def test_docstring_worked_example():
    # block_size 4: 6 tokens hold 2 blocks; 3 draft slots -> 9 slots -> 3 blocks;
    # one draft accepted -> 8 tokens -> trim to 2 blocks, the third returns to the free list
    manager = BlockManager(num_blocks=8, block_size=4)
    seq = seq_of(6)
    manager.allocate(seq, 6)
    assert len(seq.block_table) == 2
    first_two = list(seq.block_table)
    manager.allocate(seq, 6 + 3)
    assert len(seq.block_table) == 3 and seq.block_table[:2] == first_two
    lookahead_block = seq.block_table[2]
    seq.token_ids += [100, 101]
    manager.trim(seq, len(seq))
    assert seq.block_table == first_two
    assert lookahead_block in manager.free_block_ids
    assert (manager.num_free_blocks, manager.num_used_blocks) == (6, 2)
    manager.check_invariants()


@pytest.mark.parametrize("slots, blocks", [(0, 0), (1, 1), (4, 1), (5, 2), (8, 2), (9, 3)])
def test_blocks_for_rounds_up(slots, blocks):
    assert BlockManager(num_blocks=4, block_size=4).blocks_for(slots) == blocks


def test_allocate_only_grows_and_is_idempotent():
    manager = BlockManager(num_blocks=8, block_size=4)
    seq = seq_of(5)
    manager.allocate(seq, 5)
    table = list(seq.block_table)
    manager.allocate(seq, 5)
    manager.allocate(seq, 3)       # fewer slots than held: nothing is given back
    assert seq.block_table == table
    manager.allocate(seq, 8)       # still fits the second block
    assert seq.block_table == table


def test_can_allocate_counts_only_the_extra_blocks():
    manager = BlockManager(num_blocks=3, block_size=4)
    seq = seq_of(8)
    manager.allocate(seq, 8)                    # 2 blocks, 1 free
    assert manager.can_allocate(seq, 12)        # needs 1 more
    assert not manager.can_allocate(seq, 13)    # needs 2 more
    assert not manager.can_allocate(seq_of(5), 5)
    assert manager.can_allocate(seq_of(4), 4)


def test_allocate_past_capacity_raises_and_changes_nothing():
    manager = BlockManager(num_blocks=2, block_size=4)
    seq = seq_of(4)
    manager.allocate(seq, 4)
    with pytest.raises(MemoryError):
        manager.allocate(seq, 13)
    assert len(seq.block_table) == 1 and manager.num_free_blocks == 1
    manager.check_invariants()


def test_trim_keeps_blocks_still_covering_the_sequence():
    manager = BlockManager(num_blocks=8, block_size=4)
    seq = seq_of(5)
    manager.allocate(seq, 5 + 3)   # 8 slots: lookahead fits the second block
    manager.trim(seq, 5)
    assert len(seq.block_table) == 2
    manager.allocate(seq, 5 + 7)   # 12 slots: 3 blocks
    manager.trim(seq, 5)
    assert len(seq.block_table) == 2 and manager.num_free_blocks == 6


def test_free_returns_every_block():
    manager = BlockManager(num_blocks=6, block_size=4)
    a, b = seq_of(9), seq_of(4)
    manager.allocate(a, 9)
    manager.allocate(b, 4)
    manager.free(a)
    assert a.block_table == [] and manager.num_free_blocks == 5
    manager.free(b)
    manager.free(b)                # freeing twice is harmless
    assert manager.num_free_blocks == 6
    manager.check_invariants()


def test_check_invariants_catches_a_block_held_twice():
    manager = BlockManager(num_blocks=4, block_size=4)
    a, b = seq_of(4), seq_of(4)
    manager.allocate(a, 4)
    manager.allocate(b, 4)
    b.block_table[0] = a.block_table[0]
    with pytest.raises(AssertionError):
        manager.check_invariants()


def test_random_operations_keep_free_plus_used_equal_total():
    rng = random.Random(0)
    manager = BlockManager(num_blocks=16, block_size=4)
    seqs = [seq_of(rng.randint(1, 10)) for _ in range(6)]
    for _ in range(500):
        seq = rng.choice(seqs)
        action = rng.choice(["grow", "lookahead", "trim", "free"])
        if action == "grow":
            seq.token_ids.append(0)
            if manager.can_allocate(seq, len(seq)):
                manager.allocate(seq, len(seq))
        elif action == "lookahead":
            slots = len(seq) + rng.randint(1, 5)
            if manager.can_allocate(seq, slots):
                manager.allocate(seq, slots)
        elif action == "trim":
            manager.trim(seq, len(seq))
        else:
            manager.free(seq)
        manager.check_invariants()
        held = sum(len(s.block_table) for s in seqs)
        assert held == manager.num_used_blocks
        assert manager.num_free_blocks + manager.num_used_blocks == manager.num_blocks
    for seq in seqs:
        manager.free(seq)
    assert manager.num_free_blocks == manager.num_blocks
