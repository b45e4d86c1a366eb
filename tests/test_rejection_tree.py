"""The verifier on token tries (several one-hot candidates per step), with test_rejection.py's set-up.

  - a chain is the 1-child trie: the same uniforms give the same tokens as the chain verifier;
  - greedy worked examples: the candidate with the longest prefix equal to the target's argmax
    chain wins, then the target's own token;
  - statistically lossless: SEQ_LEN tokens are decoded by repeated tree steps whose tries hold
    up to 3 random one-hot candidates (shared prefixes and all); the decoded sequences follow
    plain decoding's joint distribution (total variation under its bound, chi-square does not
    reject), and a planted bug (the recovered token from the target, not the residual) fails it.
"""

import pytest
import torch

from specwise.engine.sampling import rejection
from specwise.engine.sampling.rejection import rejection_sample, tree_greedy_accept, tree_rejection_sample
from specwise.engine.spec_decode.draft_tree import DraftTree
from test_rejection import (MAX_K, SEQ_LEN, SIGNIFICANCE, VOCAB_SIZE, chi_square_p_value, joint_target,
                            make_case, sequence_counts, total_variation, tv_bound)

NUM_TRIALS = 6_000


def test_a_chain_gives_the_chain_verifiers_tokens():
    target_table, _, _ = make_case("top_k_top_p")
    generator = torch.Generator().manual_seed(3)
    for trial in range(300):
        drafts = torch.randint(0, VOCAB_SIZE, (int(torch.randint(0, MAX_K + 1, (1,), generator=generator)),),
                               generator=generator).tolist()
        probs = target_table[:len(drafts) + 1]                                  # [1 + k, vocab]
        chain = rejection_sample(probs.unsqueeze(0), [drafts], None, [False],
                                 [torch.Generator().manual_seed(trial)])[0]
        tree, _ = tree_rejection_sample(probs, drafts, list(range(-1, len(drafts) - 1)),
                                        torch.Generator().manual_seed(trial))
        assert tree == chain


def test_greedy_follows_the_longest_matching_candidate():
    tree = DraftTree.from_candidates([[5, 6, 1], [5, 7, 2], [4]])    # nodes 5 6 1 7 2 4
    # argmax after the last token, then after each node
    assert tree_greedy_accept([5, 7, 0, 0, 2, 9, 0], tree.token_ids, tree.parents) == ([5, 7, 2, 9], [0, 3, 4])
    assert tree_greedy_accept([5, 3, 0, 0, 0, 0, 0], tree.token_ids, tree.parents) == ([5, 3], [0])
    assert tree_greedy_accept([8, 0, 0, 0, 0, 0, 0], tree.token_ids, tree.parents) == ([8], [])
    assert tree_greedy_accept([4, 0, 0, 0, 0, 0, 1], tree.token_ids, tree.parents) == ([4, 1], [5])


# candidate tokens are skewed: uniformly random one-hot drafts would hide a wrong recovered token (a
# uniform draft x, rejected and followed by a sample of p_target, emits y with probability p_target(y))
CANDIDATE_WEIGHTS = torch.tensor([8.0, 4.0, 2.0, 1.0, 1.0, 1.0])


def random_trie(generator: torch.Generator) -> DraftTree:
    """Up to 3 candidates of 1..MAX_K tokens; the second often shares the first's first token."""
    candidates = []
    for _ in range(int(torch.randint(0, 4, (1,), generator=generator))):
        length = int(torch.randint(1, MAX_K + 1, (1,), generator=generator))
        candidate = torch.multinomial(CANDIDATE_WEIGHTS, length, replacement=True, generator=generator).tolist()
        if candidates and torch.rand(1, generator=generator) < 0.5:
            candidate[0] = candidates[0][0]
        candidates.append(candidate)
    return DraftTree.from_candidates(candidates)


def decode_with_tries(target_table: torch.Tensor, num_trials: int, seed: int = 1) -> torch.Tensor:
    """SEQ_LEN tokens per trial by tree steps; the target at absolute position t is target_table[t]."""
    generator = torch.Generator().manual_seed(seed)
    verifier_generator = torch.Generator().manual_seed(seed + 1)
    decoded = torch.zeros(num_trials, SEQ_LEN, dtype=torch.long)
    for trial in range(num_trials):
        tokens = []
        while len(tokens) < SEQ_LEN:
            tree = random_trie(generator)
            rows = [len(tokens)] + [len(tokens) + 1 + depth for depth in tree.depths()]
            emitted, _ = tree_rejection_sample(target_table[rows], tree.token_ids, tree.parents, verifier_generator)
            tokens += emitted
        decoded[trial] = torch.tensor(tokens[:SEQ_LEN])
    return decoded


@pytest.mark.parametrize("processing", [pytest.param("plain", marks=pytest.mark.slow), "top_k_top_p"])
def test_tries_of_one_hot_candidates_keep_the_target_distribution(processing):
    target_table, _, _ = make_case(processing)
    counts, probs = sequence_counts(decode_with_tries(target_table, NUM_TRIALS)), joint_target(target_table)
    assert total_variation(counts, probs) < tv_bound(probs, NUM_TRIALS)
    assert chi_square_p_value(counts, probs) > SIGNIFICANCE


def test_recovering_from_the_target_instead_of_the_residual_fails_the_same_check(monkeypatch):
    monkeypatch.setattr(rejection, "RESIDUAL_MASS_FLOOR", 2.0)      # every residual counts as empty
    target_table, _, _ = make_case("plain")
    counts, probs = sequence_counts(decode_with_tries(target_table, NUM_TRIALS)), joint_target(target_table)
    assert chi_square_p_value(counts, probs) < 1e-6
