"""The verifier: greedy worked examples, reproducibility, and statistical losslessness.

Statistical set-up: the target distribution at absolute position t is a fixed
P_t (position dependent, context independent), so plain decoding of SEQ_LEN
tokens has the known joint distribution P_0 x P_1 x P_2. Each trial decodes
SEQ_LEN tokens by repeated verification steps with a random number of drafts
(0..MAX_K) per step; all trials run as rows of one batch. A lossless verifier
reproduces the joint distribution of the SEQ_LEN tokens exactly, so:
  - the total-variation distance to it falls with N and stays below
    sqrt(support / N), twice the Cauchy-Schwarz bound on its expectation
    (0.5 * sum_c sqrt(p_c / N) <= 0.5 * sqrt(support / N));
  - a chi-square goodness-of-fit test does not reject at the 0.001 level.
Verifiers with a planted bug fail the same check.
"""

import pytest
import torch

from specwise.engine.sampling.sampler import SamplingTensors, logits_to_probs
from specwise.engine.spec_decode.proposer import Proposal
from specwise.engine.sampling.rejection import accept_and_resample, rejection_sample, sample_with_uniforms

VOCAB_SIZE = 6
SEQ_LEN = 3
MAX_K = 2
NUM_TRIALS = 200_000
SIGNIFICANCE = 1e-3
PROCESSING = {
    "plain": dict(temperature=1.0, top_k=0, top_p=1.0),
    "top_k": dict(temperature=0.8, top_k=3, top_p=1.0),
    "top_p": dict(temperature=1.2, top_k=0, top_p=0.7),
    "top_k_top_p": dict(temperature=1.0, top_k=4, top_p=0.8),
}


def processed_probs(logits, temperature, top_k, top_p):
    num_rows = logits.shape[0]
    return logits_to_probs(logits, SamplingTensors.build([temperature] * num_rows, [top_k] * num_rows,
                                                         [top_p] * num_rows))


def make_case(processing: str, seed: int = 0):
    """Target and draft tables [SEQ_LEN + MAX_K, VOCAB_SIZE], and fixed one-hot drafts per position."""
    generator = torch.Generator().manual_seed(seed)
    num_positions = SEQ_LEN + MAX_K
    target_logits = 1.5 * torch.randn(num_positions, VOCAB_SIZE, generator=generator)
    draft_logits = target_logits + torch.randn(num_positions, VOCAB_SIZE, generator=generator)
    settings = PROCESSING[processing]
    return (processed_probs(target_logits, **settings), processed_probs(draft_logits, **settings),
            draft_logits.argmax(dim=1))


def decode(verifier, target_table, draft_table, fixed_draft_ids, num_trials, seed=1):
    """Decode SEQ_LEN tokens in each of num_trials rows with `verifier`; returns tokens [num_trials, SEQ_LEN].

    fixed_draft_ids [SEQ_LEN + MAX_K]: one-hot drafts (the token proposed at each position, as an n-gram
    lookup would); None: drafts sampled from draft_table and passed with their probabilities.
    """
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.zeros(num_trials, SEQ_LEN + MAX_K, dtype=torch.long)
    lengths = torch.zeros(num_trials, dtype=torch.long)
    offsets = torch.arange(MAX_K + 1)
    while bool((lengths < SEQ_LEN).any()):
        active = (lengths < SEQ_LEN).nonzero().squeeze(1)
        positions = lengths[active].unsqueeze(1) + offsets  # [num_active, MAX_K + 1]
        target_probs = target_table[positions]  # [num_active, MAX_K + 1, VOCAB_SIZE]
        step_draft_probs = draft_table[positions[:, :MAX_K]]  # [num_active, MAX_K, VOCAB_SIZE]
        num_drafts = torch.randint(0, MAX_K + 1, (len(active),), generator=generator)
        if fixed_draft_ids is not None:
            draft_ids, draft_probs = fixed_draft_ids[positions[:, :MAX_K]], None
        else:
            draft_ids = torch.multinomial(step_draft_probs.reshape(-1, VOCAB_SIZE), 1, generator=generator)
            draft_ids, draft_probs = draft_ids.reshape(len(active), MAX_K), step_draft_probs
        uniforms = torch.rand(len(active), MAX_K + 1, generator=generator)
        greedy = torch.zeros(len(active), dtype=torch.bool)
        emitted, num_emitted = verifier(target_probs, draft_ids, num_drafts, draft_probs, greedy, uniforms)
        written = offsets.unsqueeze(0) < num_emitted.unsqueeze(1)  # [num_active, MAX_K + 1]
        tokens[active.unsqueeze(1).expand_as(positions)[written], positions[written]] = emitted[written]
        lengths[active] += num_emitted
    return tokens[:, :SEQ_LEN]


def joint_target(target_table):
    """[VOCAB_SIZE ** SEQ_LEN] probability of each token sequence under plain decoding, float64."""
    joint = target_table[0].double()
    for position in range(1, SEQ_LEN):
        joint = (joint.unsqueeze(1) * target_table[position].double().unsqueeze(0)).reshape(-1)
    return joint


def sequence_counts(tokens):
    weights = VOCAB_SIZE ** torch.arange(SEQ_LEN - 1, -1, -1)
    return torch.bincount((tokens * weights).sum(dim=1), minlength=VOCAB_SIZE ** SEQ_LEN).double()


def total_variation(counts, probs):
    return 0.5 * float((counts / counts.sum() - probs).abs().sum())


def tv_bound(probs, num_samples):
    return float((probs > 0).sum() / num_samples) ** 0.5


def chi_square_p_value(counts, probs):
    """Goodness of fit; cells expecting fewer than 5 are pooled; any count in a zero-probability cell gives 0."""
    if float(counts[probs == 0].sum()) > 0:
        return 0.0
    expected = probs * counts.sum()
    support = probs > 0
    small = support & (expected < 5)
    observed_bins = torch.cat([counts[support & ~small], counts[small].sum().reshape(1)])
    expected_bins = torch.cat([expected[support & ~small], expected[small].sum().reshape(1)])
    keep = expected_bins > 0
    statistic = float(((observed_bins[keep] - expected_bins[keep]) ** 2 / expected_bins[keep]).sum())
    degrees = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(degrees / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


def lossless_check(verifier, processing, one_hot, num_trials=NUM_TRIALS):
    """(TV distance, its bound, chi-square p-value) of decoded sequences against plain decoding."""
    target_table, draft_table, fixed_draft_ids = make_case(processing)
    tokens = decode(verifier, target_table, draft_table, fixed_draft_ids if one_hot else None, num_trials)
    counts, probs = sequence_counts(tokens), joint_target(target_table)
    return total_variation(counts, probs), tv_bound(probs, num_trials), chi_square_p_value(counts, probs)


def accept_all_verifier(target_probs, draft_token_ids, num_draft_tokens, draft_probs, greedy, uniforms):
    """Planted bug: every draft is accepted, then a bonus token from the target."""
    rows = torch.arange(target_probs.shape[0])
    bonus = sample_with_uniforms(target_probs[rows, num_draft_tokens], uniforms[rows, num_draft_tokens])
    emitted = torch.cat([draft_token_ids, draft_token_ids.new_zeros(len(rows), 1)], dim=1)
    emitted[rows, num_draft_tokens] = bonus
    return emitted, num_draft_tokens + 1


def recover_from_target_verifier(target_probs, draft_token_ids, num_draft_tokens, draft_probs, greedy, uniforms):
    """Planted bug: the right acceptance test, but the recovered token is sampled from p_target, not the residual."""
    rows = torch.arange(target_probs.shape[0])
    max_k = draft_token_ids.shape[1]
    target_at_draft = target_probs[:, :max_k].gather(2, draft_token_ids.unsqueeze(2)).squeeze(2)
    draft_at_draft = (torch.ones_like(target_at_draft) if draft_probs is None
                      else draft_probs.gather(2, draft_token_ids.unsqueeze(2)).squeeze(2))
    has_draft = torch.arange(max_k).unsqueeze(0) < num_draft_tokens.unsqueeze(1)
    accepted = has_draft & (uniforms[:, :max_k] * draft_at_draft < target_at_draft)
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)
    final = sample_with_uniforms(target_probs[rows, num_accepted], uniforms[rows, num_draft_tokens])
    emitted = torch.cat([draft_token_ids, draft_token_ids.new_zeros(len(rows), 1)], dim=1)
    emitted[rows, num_accepted] = final
    return emitted, num_accepted + 1


@pytest.mark.parametrize("one_hot", [True, False], ids=["one_hot_drafts", "sampled_drafts"])
@pytest.mark.parametrize("processing", PROCESSING)
def test_emitted_sequences_have_the_target_distribution(processing, one_hot):
    tv, bound, p_value = lossless_check(accept_and_resample, processing, one_hot, num_trials=60_000)
    assert tv < bound
    assert p_value > SIGNIFICANCE


def test_total_variation_falls_with_the_number_of_trials():
    target_table, draft_table, _ = make_case("plain")
    tokens = decode(accept_and_resample, target_table, draft_table, None, NUM_TRIALS)
    probs = joint_target(target_table)
    distances = [total_variation(sequence_counts(tokens[:num_trials]), probs)
                 for num_trials in (2_000, 20_000, NUM_TRIALS)]
    assert distances[0] > distances[1] > distances[2]
    assert distances[2] < tv_bound(probs, NUM_TRIALS)
    assert chi_square_p_value(sequence_counts(tokens), probs) > SIGNIFICANCE


@pytest.mark.parametrize("one_hot", [True, False], ids=["one_hot_drafts", "sampled_drafts"])
@pytest.mark.parametrize("processing", ["plain", "top_k_top_p"])
@pytest.mark.parametrize("wrong_verifier", [accept_all_verifier, recover_from_target_verifier],
                         ids=["accept_all", "recover_from_target"])
def test_wrong_verifiers_fail_the_same_check(wrong_verifier, processing, one_hot):
    tv, bound, p_value = lossless_check(wrong_verifier, processing, one_hot, num_trials=50_000)
    assert tv > bound
    assert p_value < 1e-6


def test_public_entry_with_per_request_generators_is_lossless():
    """Same decode, through rejection_sample: each trial is a request with its own seeded generator."""
    target_table, draft_table, _ = make_case("top_k")
    num_trials = 4_000
    generators = [torch.Generator().manual_seed(1000 + row) for row in range(num_trials)]
    lengths = [0] * num_trials

    def through_rejection_sample(target_probs, draft_token_ids, num_draft_tokens, draft_probs, greedy, uniforms):
        active = [row for row in range(num_trials) if lengths[row] < SEQ_LEN]  # decode's row order
        ragged = [ids[:count] for ids, count in zip(draft_token_ids.tolist(), num_draft_tokens.tolist())]
        emitted = rejection_sample(target_probs, ragged, draft_probs, greedy.tolist(),
                                   [generators[row] for row in active])
        padded = torch.zeros(len(emitted), MAX_K + 1, dtype=torch.long)
        for index, (row, tokens) in enumerate(zip(active, emitted)):
            padded[index, :len(tokens)] = torch.tensor(tokens)
            lengths[row] += len(tokens)
        return padded, torch.tensor([len(tokens) for tokens in emitted])

    tokens = decode(through_rejection_sample, target_table, draft_table, None, num_trials)
    probs = joint_target(target_table)
    assert chi_square_p_value(sequence_counts(tokens), probs) > SIGNIFICANCE


def greedy_target(argmax_per_row: list[list[int]], vocab_size: int = 12) -> torch.Tensor:
    """[num_seqs, positions, vocab_size] one-hot target probs, built as the engine does (temperature 0)."""
    num_seqs, num_positions = len(argmax_per_row), len(argmax_per_row[0])
    logits = torch.randn(num_seqs * num_positions, vocab_size, generator=torch.Generator().manual_seed(3))
    logits[torch.arange(num_seqs * num_positions), torch.tensor(argmax_per_row).reshape(-1)] = 10.0
    probs = processed_probs(logits, temperature=0.0, top_k=0, top_p=1.0)
    return probs.reshape(num_seqs, num_positions, vocab_size)


def run_greedy(argmax_per_row, draft_token_ids, draft_probs=None):
    generators = [torch.Generator().manual_seed(row) for row in range(len(draft_token_ids))]
    return rejection_sample(greedy_target(argmax_per_row), draft_token_ids, draft_probs,
                            [True] * len(draft_token_ids), generators)


def test_greedy_accepts_the_matching_prefix_and_recovers_the_argmax():
    assert run_greedy([[5, 7, 2, 9]], [[5, 7, 3]]) == [[5, 7, 2]]


def test_greedy_stops_at_the_first_mismatch_even_if_later_drafts_match():
    assert run_greedy([[5, 7, 2, 9]], [[4, 7, 2]]) == [[5]]


def test_greedy_adds_the_bonus_token_when_all_drafts_are_accepted():
    assert run_greedy([[5, 7, 2, 9]], [[5, 7, 2]]) == [[5, 7, 2, 9]]


def test_greedy_row_without_drafts_emits_the_argmax():
    assert run_greedy([[5, 7, 2, 9]], [[]]) == [[5]]


def test_greedy_batch_with_mixed_draft_lengths():
    argmax = [[5, 7, 2, 9], [1, 1, 1, 1], [3, 4, 5, 6], [8, 0, 8, 0]]
    drafts = [[5, 7, 2], [1], [], [8, 1]]
    assert run_greedy(argmax, drafts) == [[5, 7, 2, 9], [1, 1], [3], [8, 0]]


def test_greedy_ignores_draft_probabilities_and_consumes_no_randomness():
    draft_probs = torch.full((1, 3, 12), 1 / 12)
    generator = torch.Generator().manual_seed(7)
    state_before = generator.get_state()
    emitted = rejection_sample(greedy_target([[5, 7, 2, 9]]), [[5, 7, 3]], draft_probs, [True], [generator])
    assert emitted == [[5, 7, 2]]
    assert torch.equal(generator.get_state(), state_before)


def test_a_batch_without_any_drafts_samples_one_token_per_row():
    target_probs = torch.tensor([[[0.0, 1.0, 0.0]], [[0.2, 0.0, 0.8]]])  # [2, 1, 3]: max_k = 0
    emitted = rejection_sample(target_probs, [[], []], None, [True, False], seeded([0, 1]))
    assert emitted[0] == [1] and emitted[1][0] in (0, 2) and len(emitted[1]) == 1


def random_batch(seed: int, draft_lengths: list[int], max_k: int, vocab_size: int = 10):
    generator = torch.Generator().manual_seed(seed)
    num_seqs = len(draft_lengths)
    target_probs = torch.rand(num_seqs, max_k + 1, vocab_size, generator=generator).softmax(dim=-1)
    draft_probs = torch.rand(num_seqs, max_k, vocab_size, generator=generator).softmax(dim=-1)
    drafts = [torch.multinomial(draft_probs[row, :length], 1, generator=generator).squeeze(1).tolist()
              if length else [] for row, length in enumerate(draft_lengths)]
    return target_probs, drafts, draft_probs


def seeded(seeds):
    return [torch.Generator().manual_seed(seed) for seed in seeds]


def test_same_seeds_reproduce_the_same_output():
    target_probs, drafts, draft_probs = random_batch(0, [3, 0, 2, 3, 1, 3], max_k=3)
    greedy = [False] * 6
    first = rejection_sample(target_probs, drafts, draft_probs, greedy, seeded(range(6)))
    second = rejection_sample(target_probs, drafts, draft_probs, greedy, seeded(range(6)))
    assert first == second
    outputs = {str(rejection_sample(target_probs, drafts, draft_probs, greedy, seeded(range(seed, seed + 6))))
               for seed in range(0, 60, 6)}
    assert len(outputs) > 1


def test_a_seeded_row_gives_the_same_output_in_any_batch():
    target_probs, drafts, draft_probs = random_batch(1, [2, 4, 0, 1], max_k=4)
    in_batch = rejection_sample(target_probs, drafts, draft_probs, [False, True, False, False],
                                seeded([11, 12, 13, 14]))
    alone = rejection_sample(target_probs[:1, :3], drafts[:1], draft_probs[:1, :2], [False], seeded([11]))
    assert alone[0] == in_batch[0]


def test_a_sampled_row_draws_exactly_k_plus_one_uniforms():
    target_probs, drafts, draft_probs = random_batch(2, [3], max_k=3)
    used, reference = seeded([5, 5])
    rejection_sample(target_probs, drafts, draft_probs, [False], [used])
    torch.rand(4, generator=reference)
    assert torch.equal(used.get_state(), reference.get_state())


def test_one_hot_drafts_match_explicit_one_hot_probabilities():
    target_probs, drafts, _ = random_batch(3, [3, 2, 0], max_k=3)
    explicit = Proposal(drafts, [None, None, None]).padded_draft_probs(3, 10)
    assert explicit is None
    one_hot = Proposal(drafts, [None, torch.eye(10)[drafts[1]], None]).padded_draft_probs(3, 10)
    greedy = [False] * 3
    assert (rejection_sample(target_probs, drafts, None, greedy, seeded([1, 2, 3]))
            == rejection_sample(target_probs, drafts, one_hot, greedy, seeded([1, 2, 3])))


def test_residual_without_mass_falls_back_to_the_target():
    target = torch.tensor([0.5, 0.5, 0.0, 0.0])
    num_rows = 4_000
    target_probs = target.expand(num_rows, 2, 4)
    # the draft equals the target and proposes a token neither can produce: always rejected, empty residual
    emitted, num_emitted = accept_and_resample(
        target_probs, torch.full((num_rows, 1), 3), torch.ones(num_rows, dtype=torch.long),
        target.expand(num_rows, 1, 4), torch.zeros(num_rows, dtype=torch.bool),
        torch.rand(num_rows, 2, generator=torch.Generator().manual_seed(0)))
    assert torch.equal(num_emitted, torch.ones(num_rows, dtype=torch.long))
    counts = torch.bincount(emitted[:, 0], minlength=4).double()
    assert chi_square_p_value(counts, target.double()) > SIGNIFICANCE


def test_sample_with_uniforms_never_returns_a_token_without_mass():
    probs = torch.tensor([[0.0, 0.3, 0.7, 0.0, 0.0], [0.0, 0.3, 0.7, 0.0, 0.0], [1e-30, 0.0, 1.0, 0.0, 0.0]])
    # the last uniform stands for u * total mass rounding up to the total itself
    uniforms = torch.tensor([0.0, 1.0 - 2.0 ** -24, 1.0])
    assert sample_with_uniforms(probs, uniforms).tolist() == [1, 2, 2]


@pytest.mark.parametrize("draft_token_ids, greedy, num_generators, draft_probs_shape", [
    ([[1, 2, 3]], [False], 1, None),           # more drafts than target positions
    ([[1]], [False, True], 1, None),           # ragged lists disagree
    ([[12]], [False], 1, None),                # token outside the vocabulary
    ([[1]], [False], 1, (1, 1, 11)),           # draft_probs of the wrong shape
])
def test_inconsistent_batches_are_rejected(draft_token_ids, greedy, num_generators, draft_probs_shape):
    draft_probs = None if draft_probs_shape is None else torch.zeros(draft_probs_shape)
    with pytest.raises(ValueError):
        rejection_sample(torch.full((1, 3, 12), 1 / 12), draft_token_ids, draft_probs, greedy,
                         seeded(range(num_generators)))


def test_proposal_pads_draft_probabilities_for_the_verifier():
    first = torch.tensor([[0.25, 0.75, 0.0], [0.5, 0.5, 0.0]])
    proposal = Proposal([[1, 0], [], [2]], [first, None, None])
    assert proposal.num_draft_tokens == [2, 0, 1]
    padded = proposal.padded_draft_probs(max_k=3, vocab_size=3)  # [3, 3, 3]
    assert torch.equal(padded[0, :2], first)
    assert torch.equal(padded[2, 0], torch.tensor([0.0, 0.0, 1.0]))
    assert float(padded[0, 2].sum()) == float(padded[1].sum()) == float(padded[2, 1:].sum()) == 0.0


def test_proposal_rejects_probabilities_that_do_not_fit_the_drafts():
    with pytest.raises(ValueError):
        Proposal([[1, 2]], [torch.zeros(3, 5)])
    with pytest.raises(ValueError):
        Proposal([[1], [2]], [None])
