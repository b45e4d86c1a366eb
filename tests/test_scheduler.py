"""Continuous batching with chunked prefill: admission limits, the token budget, lookahead reservation,
preemption and abort (no model)."""

import random

from specwise.engine.block_manager import BlockManager
from specwise.engine.scheduler import Scheduler
from specwise.engine.sequence import Sequence, SequenceStatus
from specwise.sampling_params import SamplingParams


def make_scheduler(num_blocks: int, block_size: int = 4, max_num_seqs: int = 8,
                   max_num_batched_tokens: int = 64) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, block_size), max_num_seqs, max_num_batched_tokens)


def add(scheduler: Scheduler, prompt_len: int, name: str = "r") -> Sequence:
    seq = Sequence(name, list(range(prompt_len)), SamplingParams())
    scheduler.add(seq)
    return seq


def emit(scheduler: Scheduler, batch, tokens_per_seq: int = 1) -> None:
    """What the engine does after a step: a sequence whose chunk reached its end appends the new
    tokens, marks all but the last computed and gives back unused lookahead; a prompt chunk short
    of the end just counts as computed."""
    for index, seq in enumerate(batch.seqs):
        emitted = tokens_per_seq if batch.samples(index) else 0
        scheduler.step_done(seq, batch.num_new_tokens[index], emitted)
        if emitted:
            seq.token_ids += [7] * emitted
            scheduler.return_lookahead(seq)


def test_prefill_admits_waiting_sequences_in_arrival_order():
    scheduler = make_scheduler(num_blocks=8)
    a, b = add(scheduler, 3, "a"), add(scheduler, 5, "b")
    batch = scheduler.schedule()
    assert batch.seqs == [a, b] and batch.num_new_tokens == [3, 5] and batch.num_draft_tokens == [0, 0]
    assert batch.samples(0) and batch.samples(1)
    assert a.status == b.status == SequenceStatus.RUNNING
    assert len(a.block_table) == 1 and len(b.block_table) == 2
    assert not scheduler.waiting


def test_max_num_seqs_caps_the_running_set():
    scheduler = make_scheduler(num_blocks=16, max_num_seqs=2)
    a, b, c = (add(scheduler, 4, name) for name in "abc")
    assert scheduler.schedule().seqs == [a, b]
    emit(scheduler, scheduler.schedule())               # a decode step: c still cannot join
    assert list(scheduler.waiting) == [c]
    scheduler.finish(a, "stop")
    batch = scheduler.schedule()
    assert batch.seqs == [b, c] and batch.num_new_tokens == [1, 4]     # b decodes while c prefills


def test_max_num_batched_tokens_splits_prompts_into_chunks():
    scheduler = make_scheduler(num_blocks=16, max_num_batched_tokens=10)
    a, b, c = add(scheduler, 4, "a"), add(scheduler, 5, "b"), add(scheduler, 2, "c")
    batch = scheduler.schedule()
    assert batch.seqs == [a, b, c] and batch.num_new_tokens == [4, 5, 1]   # c gets the last token of the budget
    assert batch.samples(0) and batch.samples(1) and not batch.samples(2)
    emit(scheduler, batch)
    batch = scheduler.schedule()
    assert batch.seqs == [a, b, c] and batch.num_new_tokens == [1, 1, 1] and batch.samples(2)


def test_a_long_prompt_is_prefilled_in_chunks_beside_running_decodes():
    scheduler = make_scheduler(num_blocks=32, max_num_batched_tokens=8)
    a = add(scheduler, 3, "a")
    emit(scheduler, scheduler.schedule())
    b = add(scheduler, 20, "b")
    chunks = []
    for _ in range(3):
        batch = scheduler.schedule()
        assert batch.seqs[0] is a and batch.num_new_tokens[0] == 1      # a decodes every step
        assert batch.num_tokens <= 8
        chunks.append(batch.num_new_tokens[1])
        emit(scheduler, batch)
    assert chunks == [7, 7, 6] and b.num_output_tokens == 1 and not b.is_prefilling


def test_admission_waits_for_blocks_first_come_first_served():
    scheduler = make_scheduler(num_blocks=3)
    a = add(scheduler, 8, "a")
    b = add(scheduler, 8, "b")
    c = add(scheduler, 1, "c")                          # would fit, but does not overtake b
    batch = scheduler.schedule()
    assert batch.seqs == [a, b] and batch.num_new_tokens == [8, 4]       # b starts in the one block left
    assert [seq.request_id for seq in scheduler.waiting] == ["c"]
    emit(scheduler, batch)
    scheduler.finish(a, "stop")
    batch = scheduler.schedule()
    assert batch.seqs == [b, c] and batch.num_new_tokens == [4, 1]


def test_newcomers_prefill_in_the_same_step_as_running_decodes():
    scheduler = make_scheduler(num_blocks=8)
    a = add(scheduler, 4, "a")
    emit(scheduler, scheduler.schedule())
    b = add(scheduler, 4, "b")
    batch = scheduler.schedule()
    assert batch.seqs == [a, b] and batch.num_new_tokens == [1, 4]
    emit(scheduler, batch)
    batch = scheduler.schedule()
    assert batch.seqs == [a, b] and batch.num_new_tokens == [1, 1]


def test_decode_reserves_the_slot_of_the_new_token():
    scheduler = make_scheduler(num_blocks=8)
    a = add(scheduler, 4)
    emit(scheduler, scheduler.schedule())               # 5 tokens: position 4 needs a second block
    batch = scheduler.schedule()
    assert batch.seqs == [a] and len(a.block_table) == 2


def test_lookahead_slots_are_reserved_for_drafts():
    scheduler = make_scheduler(num_blocks=8)
    a = add(scheduler, 4)
    emit(scheduler, scheduler.schedule())
    batch = scheduler.schedule(draft_budget=lambda seq: 4)
    assert batch.num_draft_tokens == [4]
    assert len(a.block_table) == scheduler.block_manager.blocks_for(len(a) + 4) == 3


def test_unused_lookahead_is_given_back_after_rejection():
    scheduler = make_scheduler(num_blocks=8)
    a = add(scheduler, 4)
    emit(scheduler, scheduler.schedule())
    batch = scheduler.schedule(draft_budget=lambda seq: 4)   # 9 slots: 3 blocks
    emit(scheduler, batch, tokens_per_seq=1)                 # every draft rejected: 6 tokens
    assert len(a.block_table) == 2
    scheduler.block_manager.check_invariants()


def test_lookahead_is_shed_before_anyone_is_preempted():
    scheduler = make_scheduler(num_blocks=4)
    a, b = add(scheduler, 4, "a"), add(scheduler, 4, "b")
    emit(scheduler, scheduler.schedule())               # 5 tokens each: 2 blocks each fills the cache
    batch = scheduler.schedule(draft_budget=lambda seq: 4)
    assert batch.seqs == [a, b], "b was preempted while a held lookahead blocks it could have shed"
    assert not scheduler.waiting
    assert all(len(seq) + k <= len(seq.block_table) * 4 for seq, k in zip(batch.seqs, batch.num_draft_tokens))
    scheduler.block_manager.check_invariants()


def test_lookahead_is_cut_to_the_slots_held_when_no_block_is_free():
    scheduler = make_scheduler(num_blocks=3)
    a = add(scheduler, 8)
    emit(scheduler, scheduler.schedule())               # 9 tokens in 3 blocks: at most 3 more slots
    batch = scheduler.schedule(draft_budget=lambda seq: 4)
    assert batch.seqs == [a] and batch.num_draft_tokens[0] <= 3
    assert len(a.block_table) == 3


def test_newest_running_sequence_is_preempted_first():
    scheduler = make_scheduler(num_blocks=4)
    a, b, c = (add(scheduler, 4, name) for name in "abc")
    d = add(scheduler, 8, "d")                          # waits: no blocks for it
    emit(scheduler, scheduler.schedule())               # a, b, c: 5 tokens each, one block free
    batch = scheduler.schedule()
    assert batch.seqs == [a, b]
    assert c.status == SequenceStatus.WAITING and c.block_table == []
    assert c.num_computed_tokens == 0 and c.num_preemptions == 1
    assert list(scheduler.waiting) == [c, d]           # the preempted go back to the front
    scheduler.block_manager.check_invariants()


def test_a_sequence_preempts_itself_when_it_is_the_newest():
    scheduler = make_scheduler(num_blocks=3)
    a, b = add(scheduler, 5, "a"), add(scheduler, 4, "b")
    emit(scheduler, scheduler.schedule())               # a fits its 2 blocks; b needs a second one
    batch = scheduler.schedule()
    assert batch.seqs == [a]
    assert list(scheduler.waiting) == [b] and b.num_preemptions == 1


def test_preempted_sequence_is_recomputed_from_all_its_tokens():
    scheduler = make_scheduler(num_blocks=4)
    a, b, c = (add(scheduler, 4, name) for name in "abc")
    emit(scheduler, scheduler.schedule())
    emit(scheduler, scheduler.schedule())               # c preempted holding 5 tokens (1 generated)
    scheduler.finish(a, "stop")
    batch = scheduler.schedule()
    assert batch.seqs == [b, c] and batch.num_new_tokens == [1, 5]
    assert c.uncomputed_token_ids == c.token_ids and len(c) == 5
    assert len(c.block_table) == 2


def test_finish_frees_blocks_of_running_and_waiting_sequences():
    scheduler = make_scheduler(num_blocks=4)
    released = []
    scheduler.release_hooks.append(released.append)
    a, b = add(scheduler, 8, "a"), add(scheduler, 8, "b")
    c = add(scheduler, 4, "c")
    scheduler.schedule()                                # a and b admitted, c waits
    scheduler.finish(a, "abort")
    scheduler.finish(c, "abort")
    assert released == [a, c]
    assert a.status == c.status == SequenceStatus.FINISHED and a.finish_reason == "abort"
    assert list(scheduler.running) == [b] and not scheduler.waiting
    assert scheduler.block_manager.num_free_blocks == 2
    scheduler.finish(b, "stop")
    assert not scheduler.has_unfinished()
    assert scheduler.block_manager.num_free_blocks == 4


def test_random_workload_never_leaks_blocks():
    # a small cache, speculation lookahead, random acceptance, random aborts: every
    # scheduled sequence has slots for its tokens and drafts, and the cache ends empty
    rng = random.Random(1)
    scheduler = make_scheduler(num_blocks=12, max_num_seqs=5, max_num_batched_tokens=40)
    limits = {}
    for index in range(20):
        seq = add(scheduler, rng.randint(1, 12), f"r{index}")
        limits[seq.seq_id] = rng.randint(1, 20)
    preempted = 0
    for _ in range(2000):
        if not scheduler.has_unfinished():
            break
        batch = scheduler.schedule(draft_budget=lambda seq: rng.randint(0, 4))
        if batch is None:
            break
        for seq, count, k in zip(batch.seqs, batch.num_new_tokens, batch.num_draft_tokens):
            assert len(seq.block_table) * 4 >= seq.num_computed_tokens + count + k
        assert batch.num_tokens <= 40 or all(count == 1 for count in batch.num_new_tokens)
        for index, (seq, k) in enumerate(zip(list(batch.seqs), batch.num_draft_tokens)):
            if not batch.samples(index):
                seq.num_computed_tokens += batch.num_new_tokens[index]
                continue
            accepted = rng.randint(0, k)
            seq.token_ids += [7] * (accepted + 1)
            seq.num_computed_tokens = len(seq) - 1
            if seq.num_output_tokens >= limits[seq.seq_id] or rng.random() < 0.03:
                scheduler.finish(seq, "stop")
            else:
                scheduler.block_manager.trim(seq, len(seq))
        preempted = max([preempted] + [seq.num_preemptions for seq in scheduler.waiting])
        scheduler.block_manager.check_invariants()
    assert not scheduler.has_unfinished()
    assert preempted > 0, "the workload should have exercised preemption"
    assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks
