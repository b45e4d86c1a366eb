"""N-gram prompt lookup: worked examples and the tie-breaking rules."""

from dataclasses import dataclass

import pytest

from specwise.engine.spec_decode.ngram import NgramProposer


@dataclass
class FakeSequence:
    token_ids: list[int]
    seq_id: int = 0
    num_prompt_tokens: int = 0
    sampling_params: object = None


def test_docstring_worked_example():
    proposer = NgramProposer(min_n=1, max_n=3)
    assert proposer.lookup([5, 8, 9, 2, 5, 8, 7, 5], k=3) == [8, 7, 5]


def test_proposes_what_followed_the_earlier_occurrence():
    # suffix [1, 2] occurred at positions 0-1, followed by 3 4 5
    assert NgramProposer(min_n=2, max_n=4).lookup([1, 2, 3, 4, 5, 9, 1, 2], k=3) == [3, 4, 5]


def test_the_longest_match_wins_over_a_more_recent_shorter_one():
    # [7, 1, 2] matches at positions 0-2 (followed by 30); only [1, 2] matches at 4-5 (followed by 40)
    token_ids = [7, 1, 2, 30, 1, 2, 40, 7, 1, 2]
    assert NgramProposer(min_n=1, max_n=3).lookup(token_ids, k=1) == [30]
    assert NgramProposer(min_n=1, max_n=2).lookup(token_ids, k=1) == [40]


def test_among_equally_long_matches_the_most_recent_wins():
    # [1, 2] occurs at 0-1 (followed by 10) and at 3-4 (followed by 20)
    assert NgramProposer(min_n=2, max_n=2).lookup([1, 2, 10, 1, 2, 20, 5, 1, 2], k=2) == [20, 5]


def test_no_match_proposes_nothing():
    proposer = NgramProposer(min_n=2, max_n=4)
    assert proposer.lookup([1, 2, 3, 4, 5, 6], k=4) == []
    assert proposer.lookup([3, 1, 9, 9, 1], k=4) == []   # only a 1-token match, below min_n
    assert proposer.lookup([], k=4) == []
    assert proposer.lookup([7, 7], k=4) == []            # too short for a 2-token suffix plus an earlier match


def test_proposal_stops_at_k():
    assert NgramProposer(min_n=2, max_n=2).lookup([1, 2, 3, 4, 5, 6, 7, 1, 2], k=2) == [3, 4]


def test_a_match_near_the_end_proposes_fewer_than_k():
    # the most recent [4, 4] ends at position 3: only one token (position 4) follows it
    assert NgramProposer(min_n=2, max_n=2).lookup([9, 9, 4, 4, 4], k=4) == [4]
    # the suffix itself never counts as a match
    assert NgramProposer(min_n=2, max_n=3).lookup([5, 6, 7], k=4) == []


def test_match_is_searched_in_prompt_and_output_alike():
    proposer = NgramProposer(min_n=2, max_n=3)
    sequence = FakeSequence(token_ids=[11, 12, 13, 14, 99, 11, 12], num_prompt_tokens=3)
    assert proposer.propose([sequence], [4]).draft_token_ids == [[13, 14, 99, 11]]


def test_propose_handles_a_batch_with_different_k():
    proposer = NgramProposer()
    seqs = [FakeSequence([1, 2, 3, 4, 1, 2]), FakeSequence([1, 2, 3, 4, 1, 2]), FakeSequence([5, 6, 7])]
    proposal = proposer.propose(seqs, [3, 0, 2])
    assert proposal.draft_token_ids == [[3, 4, 1], [], []]
    assert proposal.draft_probs is None
    proposer.free(seqs[0])


def test_long_sequence_lookup():
    token_ids = list(range(1000)) * 2 + [500, 501, 502]
    assert NgramProposer().lookup(token_ids, k=4) == [503, 504, 505, 506]


@pytest.mark.parametrize("min_n, max_n", [(0, 2), (3, 2)])
def test_bad_sizes_are_rejected(min_n, max_n):
    with pytest.raises(ValueError):
        NgramProposer(min_n=min_n, max_n=max_n)
