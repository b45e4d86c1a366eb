"""Hand-written scheduler states, shared by the engine's and the simulator's step tests.

A state is a KV cache, the scheduler's limits and its sequences: running ones with their prompt
computed and some tokens out, waiting ones not yet started. `place` puts the same state into any
Scheduler (the real engine's, or the one the simulator drives), so both sides start from one
description, not two copies of it.
"""

from dataclasses import dataclass

from specwise.engine.scheduler import Scheduler
from specwise.engine.sequence import Sequence, SequenceStatus
from specwise.sampling_params import SamplingParams


@dataclass(frozen=True)
class Seq:
    name: str
    prompt: int                # prompt tokens
    out: int = 0               # tokens already emitted (running) ; 0 for a waiting request
    max_tokens: int = 64
    running: bool = True


@dataclass(frozen=True)
class State:
    name: str
    num_blocks: int
    seqs: tuple[Seq, ...]
    block_size: int = 4
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 32


STATES = (
    # three decodes, each with 4 drafts, except "c": max_tokens leaves it room for 2
    State("decodes with drafts", 64, (Seq("a", 10, 3), Seq("b", 7, 1), Seq("c", 12, 5, max_tokens=8))),
    # a 50-token prompt arrives beside two decodes: it is chunked into what the budget leaves
    State("a long prompt arriving", 64, (Seq("a", 10, 3), Seq("b", 6, 2), Seq("p", 50, running=False))),
    # the cache is full: the oldest decode's next slot preempts the newest sequence
    # (9 blocks of 4: a, b and c hold 3 each; a's 13th slot needs a fourth)
    State("KV full", 9, (Seq("a", 12, 1), Seq("b", 12, 1), Seq("c", 12, 1), Seq("w", 5, running=False))),
)


def place(state: State, scheduler: Scheduler, add=None) -> dict[str, Sequence]:
    """Put the state's sequences into `scheduler` (oldest first); `add(token_ids, params, name)`
    creates and queues a sequence (default: a plain Sequence). Returns them by name."""
    seqs = {}
    for spec in state.seqs:
        params = SamplingParams(max_tokens=spec.max_tokens, ignore_eos=True, temperature=0)
        token_ids = [1 + i % 50 for i in range(spec.prompt)]
        seq = add(token_ids, params, spec.name) if add else _queued(scheduler, token_ids, params, spec.name)
        if spec.running:
            scheduler.waiting.remove(seq)
            seq.token_ids += [2] * spec.out
            seq.num_computed_tokens = len(seq) - 1
            scheduler.block_manager.allocate(seq, len(seq) - 1)
            seq.status = SequenceStatus.RUNNING
            scheduler.running.append(seq)
        seqs[spec.name] = seq
    return seqs


def _queued(scheduler: Scheduler, token_ids, params, name) -> Sequence:
    seq = Sequence(name, token_ids, params)
    scheduler.add(seq)
    return seq
