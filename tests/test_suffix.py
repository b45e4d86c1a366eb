"""The suffix drafter's pieces: the suffix index, the bounded global cache, the proposer's choices.

Exactness (greedy token-identical, batch 1, continuous batching, preemption) and the sampled
distribution are checked with every other drafter in tests/test_spec_exactness.py and
tests/test_spec_sampling.py; here:

  - the index's worked example (suffix_index.py), longest match wins, no crossing documents;
  - a response seen once is drafted from on a later request with the same prompt end, and
    not for another tenant; aborted responses are not cached;
  - eviction keeps the cache under its token bound, and its index consistent, over many responses;
  - threads adding and looking up at once leave the cache consistent;
  - draft length follows the match (spec_factor * m, capped by k); no match drafts nothing;
  - `--speculative suffix[:D[:T]]` parses and round-trips.
"""

import random
import threading

import pytest

from specwise.engine.sequence import Sequence, SequenceStatus
from specwise.engine.spec_decode.config import SpeculativeConfig
from specwise.engine.spec_decode.suffix import GlobalSuffixCache, SuffixProposer
from specwise.engine.spec_decode.suffix_index import SuffixIndex
from specwise.errors import ConfigError
from specwise.sampling_params import SamplingParams

A, B, C, D, Q, X, E = 1, 2, 3, 4, 5, 6, 7


def index_of(*documents) -> SuffixIndex:
    index = SuffixIndex()
    for document in documents:
        index.append(list(document))
        index.close_document()
    return index


def make_seq(prompt, output=(), tenant=None, finished=None) -> Sequence:
    seq = Sequence("r", list(prompt), SamplingParams(temperature=0))
    seq.token_ids += list(output)
    seq.tenant = tenant
    if finished:
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, finished
    return seq


def test_worked_example_of_the_index():
    index = index_of([A, B, C, D], [X, B, C, E])
    assert index.longest_match([Q, B, C], max_depth=4) == (2, [7, 2])     # most recent place first
    match = index.lookup([Q, B, C], max_depth=4, max_tokens=4, min_prob=0.1, spec_factor=1.0)
    assert (match.length, match.tokens, match.score) == (2, [E], 0.5)
    assert index.lookup([Q, B, C], 4, 4, min_prob=0.6, spec_factor=1.0).tokens == []    # 0.5 < 0.6


def test_longest_match_wins_and_frequency_picks_the_path():
    index = index_of([A, B, C, D, D], [Q, B, C, E, E], [Q, B, C, E, X])
    match = index.lookup([Q, B, C], max_depth=8, max_tokens=4, min_prob=0.1, spec_factor=4.0)
    assert match.length == 3 and match.tokens == [E, X]                 # [Q B C] twice, not [A B C]
    assert match.score == pytest.approx(1.0 + 0.5)


def test_draft_length_follows_the_match_and_k():
    index = index_of([A, B, C, D, E, X, Q, A, B, C, D])
    assert index.lookup([Q, E, X], 8, 8, 0.1, spec_factor=1.0).tokens == [Q, A]     # m = 2 -> 2 tokens
    assert index.lookup([D, E, X], 8, 8, 0.1, spec_factor=1.0).tokens == [Q, A, B]  # m = 3 -> 3 tokens
    assert index.lookup([D, E, X], 8, 2, 0.1, spec_factor=1.0).tokens == [Q, A]     # k = 2
    assert index.lookup([D, D, Q], 8, 8, 0.1, spec_factor=1.0).tokens == []         # no match


def test_a_response_seen_once_is_drafted_from_later_with_the_same_prompt_end():
    proposer = SuffixProposer()
    prompt = [9, 10, 11, 12, 13]
    response = [20, 21, 22, 23, 24, 25]
    first = make_seq(prompt, response, finished="stop")
    proposer.free(first)
    later = make_seq([40, 41] + prompt)
    assert proposer.propose([later], [4]).draft_token_ids == [[20, 21, 22, 23]]
    later.token_ids += [20, 21]
    assert proposer.propose([later], [8]).draft_token_ids == [[22, 23, 24, 25]]    # the response's end
    other_tenant = make_seq([40, 41] + prompt, tenant="b")
    assert proposer.propose([other_tenant], [4]).draft_token_ids == [[]]
    proposer.free(later)
    proposer.free(other_tenant)
    assert not proposer.requests


def test_aborted_and_preempted_sequences_are_not_cached():
    proposer = SuffixProposer()
    proposer.free(make_seq([1, 2, 3], [4, 5, 6], finished="abort"))
    proposer.free(make_seq([1, 2, 3], [4, 5, 6]))                     # preempted: not finished
    assert proposer.cache.stats()["responses"] == 0
    assert SuffixProposer(cache_tokens=0).cache is None               # suffix:D:0: no global cache


def test_per_request_index_grows_with_the_sequence():
    proposer = SuffixProposer(cache_tokens=0)
    seq = make_seq([A, B, C, D, E, A, B])
    assert proposer.propose([seq], [3]).draft_token_ids == [[C, D]]       # m = 2 allows 2
    seq.token_ids += [C, D]
    assert proposer.propose([seq], [3]).draft_token_ids == [[E, A, B]]    # m = 4 now, k = 3
    assert proposer.requests[seq.seq_id].num_indexed == len(seq.token_ids)


def test_eviction_keeps_the_cache_under_its_bound():
    cache = GlobalSuffixCache(max_tokens=500)
    rng = random.Random(0)
    for number in range(300):
        cache.add(f"t{number % 3}", [rng.randrange(50) for _ in range(rng.randrange(1, 80))])
        assert cache.num_tokens <= 500
    cache.check()
    stats = cache.stats()
    assert stats["peak_tokens"] <= 500 and 0 < stats["responses"] < 300
    cache.add(None, list(range(2000)))                                # longer than the bound: its tail
    cache.check()
    assert cache.stats()["responses"] == 1 and cache.num_tokens == 500


def test_the_newest_response_survives_eviction_and_drafts():
    cache = GlobalSuffixCache(max_tokens=100)
    for number in range(50):
        cache.add(None, [1000 + number, 1, 2, 3, 4 + number])
    assert cache.lookup(None, [1049, 1, 2], 8, 4, 0.1, 4.0).tokens == [3, 53]
    assert cache.lookup(None, [1000, 1, 2], 8, 4, 0.1, 4.0).length == 2     # 1000's response evicted


def test_threads_adding_and_reading_leave_the_cache_consistent():
    cache = GlobalSuffixCache(max_tokens=2000)
    errors = []

    def writer(seed):
        rng = random.Random(seed)
        try:
            for _ in range(300):
                tokens = [rng.randrange(20) for _ in range(rng.randrange(2, 40))]
                cache.add(f"t{seed % 2}", tokens)
                cache.lookup(f"t{seed % 2}", tokens[:3], 8, 4, 0.1, 1.0)
                cache.stats()
        except Exception as error:       # surfaced below: a thread's exception would otherwise vanish
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    cache.check()
    assert cache.stats()["peak_tokens"] <= 2000


@pytest.mark.parametrize("text, depth, cache_tokens", [("suffix", 24, 200_000), ("suffix:32", 32, 200_000),
                                                       ("SUFFIX:16:0", 16, 0), ("suffix:8:5000", 8, 5000)])
def test_speculative_text(text, depth, cache_tokens):
    config = SpeculativeConfig.parse(text, 4)
    assert (config.method, config.suffix_max_depth, config.suffix_cache_tokens) == ("suffix", depth, cache_tokens)
    assert SpeculativeConfig.parse(config.label, 4) == config


@pytest.mark.parametrize("text, message", [("suffix:1", "D >= 2"), ("suffix:x", "suffix:DEPTH"),
                                           ("suffix:8:", "suffix:DEPTH")])
def test_bad_speculative_text(text, message):
    with pytest.raises(ConfigError, match=message):
        SpeculativeConfig.parse(text, 4)
