"""The lookahead proposer (engine/spec_decode/lookahead.py): its rows, mask, pool and window.

  - the attention mask of a step with W = 2, N = 3, G = 2, written out by hand (the module's
    worked example), equals the one the proposer's draft tree gives the runner;
  - after a step, the window's n-grams enter the pool once every level came from the model,
    and the window moves one level (the last level takes the target's guesses);
  - the pool is seeded with the text's own n-grams, bounded per key and in keys; with W = 0
    the first candidate is prompt lookup's (never fewer drafts than `ngram`);
  - a smaller row budget shrinks W and G; W, N or G out of range is a one-line error naming
    the range (here for the config text; tests/test_cli_errors.py for the CLI).
"""

import pytest
import torch

from specwise.engine.sequence import Sequence
from specwise.engine.spec_decode.config import (DEFAULT_LOOKAHEAD_CANDIDATES, DEFAULT_LOOKAHEAD_NGRAM,
                                                DEFAULT_LOOKAHEAD_WINDOW, SpeculativeConfig)
from specwise.engine.spec_decode.lookahead import LookaheadProposer, window_rows
from specwise.engine.spec_decode.ngram import NgramProposer
from specwise.errors import ConfigError
from specwise.sampling_params import SamplingParams


def sequence(token_ids: list[int]) -> Sequence:
    return Sequence("r", token_ids, SamplingParams(temperature=0))


def test_window_rows_follow_the_diagonals():
    # W = 2, N = 3: rows (0,0) (0,1) (1,0) (1,1); (1, i) sees level 0 up to column i
    offsets, sees = window_rows(2, 2)
    assert offsets == [0, 1, 1, 2]
    assert sees == [[], [0], [0], [0, 1]]
    # N = 4 adds level 2, which also sees level 1 of its own column
    offsets, sees = window_rows(2, 3)
    assert offsets == [0, 1, 1, 2, 2, 3]
    assert sees[4] == [0, 2] and sees[5] == [0, 1, 3]


def test_the_step_mask_for_w2_n3_g2_by_hand():
    # text: 10 distinct tokens, then 7 9 4 6 8, 9 4 5 8, and it ends in 7 9 (L = 21), k = 2:
    # prompt lookup matches "7 9" at positions 10-11 -> drafts (4, 6); pool[9] = [(4, 5), (4, 6)] newest first
    tokens = list(range(30, 40)) + [7, 9, 4, 6, 8, 9, 4, 5, 8, 7, 9]
    proposer = LookaheadProposer(window=2, ngram=3, candidates=2, lookup_tokens=2)
    seq = sequence(tokens)
    proposer.states[seq.seq_id] = state = proposer._new_state(seq)
    state.window = [[1, 2], [3, 8]]
    tree = proposer.tree(seq, proposer.full_rows)
    assert proposer.full_rows == 8                    # (W + G)(N - 1), k not above N - 1
    # nodes: 4 (pos 21), 6 (pos 22, after 4), 5 (pos 22, after 4); window (0,0)=1 (0,1)=2 (1,0)=3 (1,1)=8
    assert tree.token_ids == [4, 6, 5, 1, 2, 3, 8]
    assert tree.position_offsets() == [0, 1, 1, 0, 1, 1, 2]
    L = len(tokens)
    c = [1] * L                                       # every row sees the whole context
    expected = torch.tensor([
        # context  4  6  5  1  2  3  8         query
        c + [0, 0, 0, 0, 0, 0, 0],           # the last token (9)
        c + [1, 0, 0, 0, 0, 0, 0],           # node 4
        c + [1, 1, 0, 0, 0, 0, 0],           # node 6, after 4
        c + [1, 0, 1, 0, 0, 0, 0],           # node 5, after 4
        c + [0, 0, 0, 1, 0, 0, 0],           # window (0,0)
        c + [0, 0, 0, 1, 1, 0, 0],           # window (0,1): level 0 is causal
        c + [0, 0, 0, 1, 0, 1, 0],           # window (1,0): level 0 column 0, itself
        c + [0, 0, 0, 1, 1, 0, 1],           # window (1,1): level 0 columns 0..1, itself
    ], dtype=torch.bool)
    assert torch.equal(tree.attention_mask(L), expected)


def test_prompt_lookups_candidate_is_k_long_and_the_pool_adds_what_it_does_not_cover():
    tokens = list(range(30, 40)) + [7, 9, 4, 6, 8, 9, 4, 5, 8, 7, 9]
    proposer = LookaheadProposer(window=2, ngram=3, candidates=3, lookup_tokens=4)
    assert proposer.full_rows == (2 + 3) * 2 + 2
    tree = proposer.tree(sequence(tokens), proposer.full_rows)
    # prompt lookup: 4 6 8 9; the pool's (4, 6) is its prefix (skipped), (4, 5) is new, (8, 7) is after 9? no:
    # pool[9] = [(4, 5), (4, 6)] -> candidates [4 6 8 9] and [4 5]
    assert [tree.path_tokens(leaf) for leaf in tree.leaves()] == [[4, 6, 8, 9], [4, 5]]
    assert tree.drafted([0, 1, 2]) == 4


def test_a_step_collects_the_window_ngrams_and_moves_it_one_level():
    proposer = LookaheadProposer(window=2, ngram=3, candidates=2)
    seq = sequence(list(range(30, 40)))
    proposer.states[seq.seq_id] = state = proposer._new_state(seq)
    state.window = [[1, 2], [3, 4]]
    state.updates = 2                                 # both levels came from the model already
    tree = proposer.tree(seq, proposer.full_rows)
    assert tree.num_nodes == 0                        # no candidate after 39 yet
    tree.argmax = [0, 0, 5, 6]                        # the runner's guesses; last level's: 5, 6
    seq.token_ids.append(40)
    proposer.tree(seq, proposer.full_rows)
    assert state.window == [[3, 4], [5, 6]]
    assert state.pool[1] == [(3, 5)] and state.pool[2] == [(4, 6)]


def test_no_ngram_is_collected_while_the_window_still_holds_prompt_tokens():
    proposer = LookaheadProposer(window=2, ngram=3, candidates=2)
    seq = sequence(list(range(30, 40)))
    tree = proposer.tree(seq, proposer.full_rows)
    before = dict(proposer.states[seq.seq_id].pool)
    tree.argmax = [0, 0, 5, 6]
    proposer.tree(seq, proposer.full_rows)
    assert dict(proposer.states[seq.seq_id].pool) == before
    assert proposer.states[seq.seq_id].window[1] == [5, 6]


def test_the_pool_is_seeded_by_the_text_and_bounded():
    proposer = LookaheadProposer(window=1, ngram=3, candidates=2, max_pool_keys=3)
    seq = sequence([1, 2, 3, 1, 4, 5, 1, 6, 7, 8, 9])
    proposer.tree(seq, proposer.full_rows)
    pool = proposer.states[seq.seq_id].pool
    assert len(pool) == 3                             # keys 7, 6 and 1... the 3 most recently updated
    assert list(pool) == [1, 6, 7]
    assert pool[1] == [(6, 7), (4, 5)]                # newest first, at most G = 2 per key


def test_without_a_window_the_first_candidate_is_prompt_lookups():
    text = [5, 8, 9, 2, 5, 8, 7, 5, 8, 9, 2, 5, 8]
    proposer = LookaheadProposer(window=0, ngram=3, candidates=3, lookup_tokens=4)
    tree = proposer.tree(sequence(text), proposer.full_rows)
    expected = NgramProposer().lookup(text, 4)         # what `ngram` at k = 4 drafts
    assert len(expected) == 4
    assert expected and tree.path_tokens(len(expected) - 1) == expected
    assert tree.num_rows == tree.num_nodes            # no Jacobi rows


def test_a_smaller_budget_shrinks_the_window_and_the_candidates():
    proposer = LookaheadProposer(window=4, ngram=3, candidates=4, lookup_tokens=4)     # 8 + 8 + 2 = 18 rows
    assert proposer.full_rows == 18
    assert proposer.sizes(18) == (4, 4, 2, 4)          # (W', G', pool candidates' length, prompt lookup's)
    assert proposer.sizes(9) == (0, 3, 2, 4)           # prompt lookup first, G in proportion, W what is left
    assert proposer.sizes(14) == (3, 3, 2, 4)           # 4 + 2 x 2 + 3 x 2 rows
    assert proposer.sizes(4) == (0, 1, 2, 4)
    assert proposer.sizes(1) == (0, 1, 1, 1)
    seq = sequence(list(range(30, 40)) + list(range(30, 40)))
    for budget in (1, 3, 9, 18):
        assert proposer.tree(seq, budget).num_rows <= budget


def test_config_text_round_trips_and_counts_the_rows():
    config = SpeculativeConfig.parse("lookahead:5,4,3", 4)
    assert (config.lookahead_window, config.lookahead_ngram, config.lookahead_candidates) == (5, 4, 3)
    assert config.step_rows == (5 + 3) * 3 + 1          # k = 4: prompt lookup's candidate is 1 longer than N - 1
    assert SpeculativeConfig.parse("lookahead:5,4,3", 2).step_rows == (5 + 3) * 3
    assert SpeculativeConfig.parse(config.label, 4) == config
    default = SpeculativeConfig.parse("lookahead", 4)
    assert default.label == "lookahead:{},{},{}".format(DEFAULT_LOOKAHEAD_WINDOW, DEFAULT_LOOKAHEAD_NGRAM,
                                                         DEFAULT_LOOKAHEAD_CANDIDATES)


@pytest.mark.parametrize("text, message", [
    ("lookahead:17,3,4", "W (window) in 0..16, got 17"),
    ("lookahead:4,1,4", "N (n-gram size) in 2..6, got 1"),
    ("lookahead:4,7,4", "N (n-gram size) in 2..6, got 7"),
    ("lookahead:4,3,0", "G (candidates) in 1..16, got 0"),
    ("lookahead:4,3", "must look like lookahead:W,N,G"),
])
def test_sizes_out_of_range_name_the_allowed_range(text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        SpeculativeConfig.parse(text, 4)
