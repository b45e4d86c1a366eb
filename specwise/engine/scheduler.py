"""Continuous batching: which sequences run in the next step (no torch).

Each step is either a prefill of newly admitted (or preempted) sequences or a decode /
verification step of every running sequence. Requests join between steps when blocks
and `max_num_seqs` allow, and leave as soon as they finish. When the KV cache runs
out, speculative lookahead is given up first (it is reserved only after every running
sequence has its next slot); if that is not enough, the newest running sequence is
preempted (blocks freed, recomputed later from its tokens).
"""

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from specwise.engine.block_manager import BlockManager
from specwise.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    seqs: list[Sequence]
    is_prefill: bool
    num_draft_tokens: list[int] = field(default_factory=list)   # per sequence; zeros at prefill


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
        """draft_budget(seq) -> how many draft tokens seq would like to verify this step."""
        prefill = self._schedule_prefill()
        if prefill:
            return ScheduledBatch(prefill, is_prefill=True, num_draft_tokens=[0] * len(prefill))
        return self._schedule_decode(draft_budget)

    def _schedule_prefill(self) -> list[Sequence]:
        scheduled, num_tokens = [], 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if num_tokens + len(seq) > self.max_num_batched_tokens:
                break
            if not self.block_manager.can_allocate(seq, len(seq)):
                break
            self.block_manager.allocate(seq, len(seq))
            num_tokens += len(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(self.waiting.popleft())
            scheduled.append(seq)
        return scheduled

    def _schedule_decode(self, draft_budget) -> ScheduledBatch | None:
        """First every running sequence's next slot (preempting the newest if needed), then
        lookahead for drafts from what is left, so speculation never costs a preemption."""
        scheduled, queue = [], list(self.running)
        while queue:
            seq = queue.pop(0)
            if self._reserve_next_slot(seq, queue):
                scheduled.append(seq)
        if not scheduled:
            return None
        drafts = [self._reserve_lookahead(seq, draft_budget(seq)) for seq in scheduled]
        return ScheduledBatch(scheduled, is_prefill=False, num_draft_tokens=drafts)

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
