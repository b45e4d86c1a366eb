"""Paged KV-cache bookkeeping: fixed-size blocks, one block table per sequence (no torch).

A sequence holding n slots owns ceil(n / block_size) blocks; slot p lives in block
block_table[p // block_size] at offset p % block_size. Speculation reserves lookahead
slots before a verification step (`allocate(seq, len(seq) + k)`) and gives back what
rejection left unused (`trim(seq, len(seq))`); stale K/V in kept slots is overwritten
by position next time, so rollback is bookkeeping only.

Worked example (block_size 4): a 6-token sequence holds blocks [7, 2]. Reserving 3 draft
slots needs 9 slots -> 3 blocks: [7, 2, 5]. One draft accepted, so the sequence is now
8 tokens long: trim to 8 slots -> 2 blocks, block 5 returns to the free list.
"""

from collections import deque

from specwise.engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.holders: dict[int, Sequence] = {}     # seq_id -> sequence holding blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_block_ids)

    def blocks_for(self, num_slots: int) -> int:
        return -(-num_slots // self.block_size)

    def extra_blocks_needed(self, seq: Sequence, num_slots: int) -> int:
        return max(0, self.blocks_for(num_slots) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_slots: int) -> bool:
        return self.extra_blocks_needed(seq, num_slots) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_slots: int) -> None:
        """Grow the block table so slots [0, num_slots) exist."""
        needed = self.extra_blocks_needed(seq, num_slots)
        if needed > self.num_free_blocks:
            raise MemoryError(f"need {needed} KV blocks, {self.num_free_blocks} free")
        seq.block_table.extend(self.free_block_ids.popleft() for _ in range(needed))
        self.holders[seq.seq_id] = seq

    def trim(self, seq: Sequence, num_slots: int) -> None:
        """Return the blocks past slot num_slots (unused lookahead after rejection)."""
        keep = self.blocks_for(num_slots)
        while len(seq.block_table) > keep:
            self.free_block_ids.append(seq.block_table.pop())

    def free(self, seq: Sequence) -> None:
        self.free_block_ids.extend(reversed(seq.block_table))
        seq.block_table = []
        self.holders.pop(seq.seq_id, None)

    def check_invariants(self) -> None:
        """free + used = total, and every block is either free or held by exactly one sequence."""
        held = [block for seq in self.holders.values() for block in seq.block_table]
        every = held + list(self.free_block_ids)
        assert len(every) == self.num_blocks, f"{len(held)} held + {self.num_free_blocks} free != {self.num_blocks}"
        assert sorted(every) == list(range(self.num_blocks)), "a block is held twice, or held and free"
