"""Continuous batching with chunked prefill: which tokens of which sequences the next step feeds (no torch).

Every step is one flat batch of tokens, at most `max_num_batched_tokens` of them:

  1. decoding sequences first (their last token, plus draft lookahead): a running request
     gets a step every step, however long the prompts that arrive meanwhile;
  2. then prompt chunks, in arrival order: sequences part-way through their prompt, then
     newly admitted ones (while `max_num_seqs` and free blocks allow), each taking what is
     left of the budget. A prompt longer than the budget is prefilled over several steps.

A sequence samples a token in the step whose chunk reaches its last token. When the KV
cache runs out, speculative lookahead is given up first (reserved only after every decoding
sequence has its next slot); if that is not enough, the newest running sequence is preempted
(blocks freed, recomputed later from its tokens, in chunks like a prompt).

Worked example (budget 8, block_size 4): A decodes (1 token), B has a 12-token prompt.
Step 1: A 1 token + B tokens 0..6 (7). Step 2: A 1 + B tokens 7..11 (5): B samples its first
token. Step 3: A and B decode, 1 token each.
"""

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from specwise.engine.block_manager import BlockManager
from specwise.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    """Sequence i feeds token_ids[num_computed : num_computed + num_new_tokens[i]], plus up to
    num_draft_tokens[i] drafts when it decodes (zero for prompt chunks)."""

    seqs: list[Sequence]
    num_new_tokens: list[int]
    num_draft_tokens: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.num_draft_tokens = self.num_draft_tokens or [0] * len(self.seqs)

    def samples(self, index: int) -> bool:
        """Does sequence `index` emit tokens this step (its chunk reaches its last token)?"""
        seq = self.seqs[index]
        return seq.num_computed_tokens + self.num_new_tokens[index] == len(seq)

    def subset(self, rows: list[int]) -> "ScheduledBatch":
        """The batch of sequences `rows` alone, with their tokens and drafts (fault_isolation.py)."""
        return ScheduledBatch([self.seqs[row] for row in rows], [self.num_new_tokens[row] for row in rows],
                              [self.num_draft_tokens[row] for row in rows])

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens) + sum(self.num_draft_tokens)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self.release_hooks: list[Callable[[Sequence], None]] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, draft_budget: Callable[[Sequence], int] = lambda seq: 0) -> ScheduledBatch | None:
        """draft_budget(seq) -> how many draft tokens a decoding seq would like to verify this step."""
        num_waiting = len(self.waiting)
        decoding = self._schedule_decode()
        drafts = [self._reserve_lookahead(seq, draft_budget(seq)) for seq in decoding]
        budget = self.max_num_batched_tokens - len(decoding) - sum(drafts)
        # nobody is admitted in a step that preempted: the cache is short, and the preempted
        # sequence would come straight back only to be preempted again
        chunks, chunk_lens = self._schedule_chunks(budget, admit=len(self.waiting) == num_waiting)
        if not decoding and not chunks:
            return None
        return ScheduledBatch(decoding + chunks, [1] * len(decoding) + chunk_lens, drafts + [0] * len(chunks))

    def _schedule_decode(self) -> list[Sequence]:
        """Every decoding sequence's next slot, preempting the newest running sequence if needed."""
        scheduled, queue = [], list(self.running)
        while queue:
            seq = queue.pop(0)
            if seq.is_prefilling:
                continue
            if self._reserve_next_slot(seq, queue):
                scheduled.append(seq)
        return scheduled

    def _schedule_chunks(self, budget: int, admit: bool) -> tuple[list[Sequence], list[int]]:
        """Prompt chunks within `budget` tokens: running prefills first, then admissions."""
        seqs, lens = [], []
        for seq in [seq for seq in self.running if seq.is_prefilling]:
            length = self._allocate_chunk(seq, budget)
            if length:
                seqs.append(seq)
                lens.append(length)
                budget -= length
        while admit and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            length = self._allocate_chunk(seq, budget)
            if not length:
                break                                   # first come, first served: nobody overtakes
            seq.status = SequenceStatus.RUNNING
            self.running.append(self.waiting.popleft())
            seqs.append(seq)
            lens.append(length)
            budget -= length
        return seqs, lens

    def _allocate_chunk(self, seq: Sequence, budget: int) -> int:
        """The longest chunk of seq's uncomputed tokens within budget and the free blocks (0: none)."""
        length = min(seq.num_uncomputed_tokens, budget)
        while length > 0 and not self.block_manager.can_allocate(seq, seq.num_computed_tokens + length):
            length -= self.block_manager.block_size
        if length <= 0:
            return 0
        self.block_manager.allocate(seq, seq.num_computed_tokens + length)
        return length

    def _reserve_next_slot(self, seq: Sequence, queue: list[Sequence]) -> bool:
        while not self.block_manager.can_allocate(seq, len(seq)):
            if not queue:
                self.preempt(seq)
                return False
            self.preempt(queue.pop())
        self.block_manager.allocate(seq, len(seq))
        return True

    def _reserve_lookahead(self, seq: Sequence, num_draft: int) -> int:
        if num_draft and self.block_manager.can_allocate(seq, len(seq) + num_draft):
            self.block_manager.allocate(seq, len(seq) + num_draft)
            return num_draft
        return 0

    def preempt(self, seq: Sequence) -> None:
        self._release(seq)
        self.running.remove(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Remove a running or waiting sequence for good and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self._release(seq)      # after the status: release hooks drop per-request state of finished sequences

    def _release(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        for hook in self.release_hooks:
            hook(seq)
