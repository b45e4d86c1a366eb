"""End to end, sampled: speculative decoding leaves the target's output distribution unchanged.

tests/test_rejection.py checks the verifier alone on synthetic tables. Here the whole
engine runs (scheduler, drafters, runner, sampler, verifier): one engine per drafter
serves NUM_SEEDS requests per sampling setting, each with its own seed and
max_tokens=4, all in one continuous batch. The first DEPTH tokens of every request
form one sample of a DEPTH-token tuple. The exact distribution of those tuples under
plain decoding (temperature, top-k, top-p applied as the sampler does) comes from
the target model itself, one forward per prefix, so the samples are compared with
the truth, not with another noisy run:

  - chi-square goodness of fit over the tuples (tuples expecting fewer than 5
    samples are pooled with everything never enumerated into one "rest" bin, whose
    probability is exactly 1 - the enumerated mass) does not reject at SIGNIFICANCE;
  - the same check rejects decisively (p < BROKEN_SIGNIFICANCE) when the verifier is
    broken on purpose: accept every draft, or recover from p_target instead of the
    residual, so the test can fail.

Drafters: ngram (one-hot drafts), draft_same (a draft model with the target's weights:
p_draft == p_target, every draft accepted), draft_near (the target's weights plus noise:
sampled drafts from a different distribution, about a third accepted), layer_skip:1, suffix (one-hot),
eagle, eagle3 and medusa (heads fitted for a few steps to the target's greedy text, tests/head_training.py:
sampled drafts, some accepted), eagle_vocab (the EAGLE head drafting from a draft vocabulary: p_draft
is 0 outside it), lookahead (one-hot draft trees of up to 3 candidates, verified by the trie walk).

With max_tokens=4 and k >= 2 the first verification step (after the prefill token)
carries 2 drafts, so tokens 2 and 3 come from draft positions 0 and 1, from a
recovered token, or from a bonus token.

The n-gram drafter only proposes where the context repeats; a random model does not
copy, so the prompt is picked (deterministically) among candidates built from the
target's own greedy continuations as the one whose first draft the target accepts
most often (among those whose first token is not near-deterministic): n-gram drafts
are then both accepted and rejected, as with real text.
"""

from collections import Counter
from pathlib import Path

import pytest
import torch

from specwise.config import EngineConfig
from specwise.engine.llm_engine import LLMEngine
from specwise.engine.model_runner import ModelRunner
from specwise.engine.sampling import rejection
from specwise.engine.sampling.sampler import SamplingTensors, logits_to_probs
from specwise.engine.spec_decode.metrics import SpecStats
from specwise.engine.spec_decode.ngram import NgramProposer
from specwise.models.checkpoints.loader import build_model, load_checkpoint
from specwise.models.config import ModelConfig
from specwise.sampling_params import SamplingParams
from head_training import fitted_head_dir, greedy_texts
from tiny_checkpoints import make_tiny_hf_config, write_hf_checkpoint
from tiny_models import random_weights

NUM_SEEDS = 300               # requests per sampling setting, per drafter
DEPTH = 3                     # tokens per sample tuple
MAX_TOKENS = 4
K = 3
HEAD_SCALE = 0.3              # shrinks the LM head: next-token entropy ~1.5 nats instead of ~0
BLOCK_SIZE = 4
SIGNIFICANCE = 1e-3
BROKEN_SIGNIFICANCE = 1e-4
ENUMERATION_FLOOR = 1e-4      # tuples (and prefixes) less likely than this go to the "rest" bin
NGRAM = "ngram:1-3"
DRAFT_NOISE = 0.5             # relative weight noise of the draft_near model
MIN_ENTROPY = 1.0             # nats, of the first token of the chosen prompt at temperature 1
SETTINGS = {
    "plain": dict(temperature=1.0),
    "top_k_top_p": dict(temperature=1.3, top_k=10, top_p=0.9),
}
DRAFTERS = ["ngram", pytest.param("draft_same", marks=pytest.mark.slow), "draft_near", "layer_skip", "suffix",
            "eagle", "eagle3", "medusa", "eagle_vocab", "lookahead"]


def write_tiny_model(directory: Path, seed: int, num_layers: int, noise: float = 0.0, noise_seed: int = 1) -> Path:
    """A tiny HF directory; `noise` > 0 perturbs every weight (a draft close to, not equal to, the target)."""
    config = make_tiny_hf_config(num_hidden_layers=num_layers)
    weights = random_weights(ModelConfig.from_hf(config), seed)
    weights["lm_head.weight"] = weights["lm_head.weight"] * HEAD_SCALE
    if noise:
        generator = torch.Generator().manual_seed(noise_seed)
        weights = {name: tensor + noise * tensor.std() * torch.randn(tensor.shape, generator=generator)
                   if tensor.dim() == 2 else tensor for name, tensor in weights.items()}
    return write_hf_checkpoint(directory, config, weights)


class Setup:
    """The target (2 layers), two draft directories, the exact tuple distributions, the prompt."""

    def __init__(self, root: Path):
        self.target_path = write_tiny_model(root / "target", seed=0, num_layers=2)
        near_path = write_tiny_model(root / "near", seed=0, num_layers=2, noise=DRAFT_NOISE)
        self.target = load_checkpoint(self.target_path)
        self.speculative = {"ngram": NGRAM, "draft_same": f"draft:{self.target_path}",
                            "draft_near": f"draft:{near_path}", "layer_skip": "layer_skip:1", "suffix": "suffix",
                            "lookahead": "lookahead:3,3,3"}
        model = build_model(self.target, torch.float32, "cpu", 128, plain=True)    # trains heads
        self.runner = ModelRunner(model, num_blocks=256 * 32, block_size=BLOCK_SIZE, dtype=torch.float32)
        self.prompt, self.ngram_acceptance = self.ngram_friendly_prompt()
        texts = greedy_texts(model, [self.prompt[:length] for length in (4, 8, len(self.prompt))], max_tokens=24)
        # eagle_vocab drafts from the tokens of its texts only: p_draft is 0 on the rest of the vocabulary
        seen = sorted({token for text in texts for token in text})
        for name, kind, num_heads, vocab in (("eagle", "eagle", 0, None), ("eagle3", "eagle3", 0, None),
                                             ("medusa", "medusa", K, None), ("eagle_vocab", "eagle", 0, seen)):
            head = fitted_head_dir(root / name, kind, self.target, model, texts, steps=100, num_heads=num_heads,
                                   draft_vocab=vocab)
            self.speculative[name] = f"{kind}:{head}"
        self.exact = {name: self.tuple_probs(SamplingParams(**setting)) for name, setting in SETTINGS.items()}

    def next_probs(self, prefixes: list[list[int]], params: SamplingParams) -> torch.Tensor:
        """Plain decoding's next-token distribution after each prefix, [len(prefixes), vocab] float64."""
        rows = []
        for start in range(0, len(prefixes), 256):
            chunk = prefixes[start:start + 256]
            blocks = -(-max(map(len, chunk)) // BLOCK_SIZE)
            tables = [list(range(row * blocks, (row + 1) * blocks)) for row in range(len(chunk))]
            logits = self.runner.forward(chunk, [0] * len(chunk), tables, num_logits=[1] * len(chunk))
            count = len(chunk)
            rows.append(logits_to_probs(logits, SamplingTensors.from_params([params] * count, 1)).double())
        return torch.cat(rows)

    def tuple_probs(self, params: SamplingParams, prompt: list[int] | None = None) -> dict[tuple[int, ...], float]:
        """P(first DEPTH tokens = t) for every tuple t of probability >= ENUMERATION_FLOOR (plain decoding)."""
        prompt = self.prompt if prompt is None else prompt
        probs = {(): 1.0}
        for _ in range(DEPTH):
            prefixes = [(prefix, mass) for prefix, mass in probs.items() if mass >= ENUMERATION_FLOOR]
            rows = self.next_probs([prompt + list(prefix) for prefix, _ in prefixes], params)
            probs = {}
            for (prefix, mass), row in zip(prefixes, rows):
                joint = row * mass
                for token in (joint >= ENUMERATION_FLOOR).nonzero().squeeze(1).tolist():
                    probs[prefix + (token,)] = float(joint[token])
        return probs

    def ngram_friendly_prompt(self) -> tuple[list[int], float]:
        """Among prefixes of the target's greedy continuations, the one whose first n-gram draft is most
        often accepted at temperature 1; returns it and that acceptance probability."""
        greedy, plain = SamplingParams(temperature=0), SamplingParams(temperature=1.0)
        generator = torch.Generator().manual_seed(0)
        bos = self.target.tokenizer.bos_token_id
        sequences = [[bos] + torch.randint(3, 400, (4,), generator=generator).tolist() for _ in range(6)]
        for _ in range(36):
            next_tokens = self.next_probs(sequences, greedy).argmax(dim=1).tolist()
            sequences = [seq + [token] for seq, token in zip(sequences, next_tokens)]
        candidates = [seq[:length] for seq in sequences for length in range(16, 41, 4)]
        first = self.next_probs(candidates, plain)                               # [candidates, vocab]
        ngram = NgramProposer(*map(int, NGRAM.partition(":")[2].split("-")))
        pairs = [(index, token) for index, row in enumerate(first)
                 for token in (row > 0.01).nonzero().squeeze(1).tolist()]
        second = self.next_probs([candidates[index] + [token] for index, token in pairs], plain)
        scores = [0.0] * len(candidates)
        for (index, token), row in zip(pairs, second):
            draft = ngram.lookup(candidates[index] + [token], 1)
            if draft:
                scores[index] += float(first[index, token] * row[draft[0]])
        # a near-deterministic next token would leave too few tuples to test: ask for some spread
        entropies = -(first * first.clamp(min=1e-30).log()).sum(dim=1)
        spread = [index for index in range(len(candidates)) if entropies[index] >= MIN_ENTROPY]
        best = max(spread, key=scores.__getitem__)
        return candidates[best], scores[best]


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Setup:
    built = Setup(tmp_path_factory.mktemp("spec_sampling"))
    # a usable n-gram test needs drafts the target accepts as well as ones it rejects
    assert 0.2 < built.ngram_acceptance < 0.9, built.ngram_acceptance
    return built


def test_exact_tuple_probabilities_are_a_distribution(setup):
    for name, probs in setup.exact.items():
        assert 0.9 < sum(probs.values()) <= 1 + 1e-9, name
        assert len([p for p in probs.values() if p * NUM_SEEDS >= 5]) >= 10, f"{name}: too few tuples to test"


def sample(setup: Setup, speculative: str | None, prompt: list[int] | None = None,
           watch=None) -> tuple[dict[str, list[tuple]], LLMEngine, SpecStats]:
    """NUM_SEEDS requests per setting in one engine; first DEPTH tokens of each, and the summed per-request stats.
    watch(proposal) sees every proposal."""
    num_requests = NUM_SEEDS * len(SETTINGS)
    engine = LLMEngine(EngineConfig(dtype="float32", speculative=speculative, num_speculative_tokens=K, block_size=BLOCK_SIZE,
                                    num_kv_blocks=num_requests * 12 + 16, max_model_len=128,
                                    max_num_batched_tokens=8192, max_num_seqs=num_requests), setup.target)
    if watch is not None:
        propose = engine.proposer.propose
        engine.proposer.propose = lambda seqs, budgets: watch(propose(seqs, budgets))
    request_ids = {}
    for name, setting in SETTINGS.items():
        request_ids[name] = [engine.add_request(setup.prompt if prompt is None else prompt, SamplingParams(
            **setting, seed=seed, max_tokens=MAX_TOKENS, ignore_eos=True)) for seed in range(NUM_SEEDS)]
    finished = {}
    while engine.has_unfinished():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
    per_request = SpecStats()
    for output in finished.values():
        assert len(output.output_token_ids) == MAX_TOKENS
        per_request = per_request.merge(output.spec)
    samples = {name: [tuple(finished[rid].output_token_ids[:DEPTH]) for rid in ids]
               for name, ids in request_ids.items()}
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return samples, engine, per_request


def chi_square_p_value(samples: list[tuple], probs: dict[tuple, float]) -> float:
    """Goodness of fit of the sampled tuples to the exact distribution (see the module docstring)."""
    num_samples = len(samples)
    counts = Counter(samples)
    bins = [t for t, p in probs.items() if p * num_samples >= 5]
    observed = [counts.get(t, 0) for t in bins]
    expected = [probs[t] * num_samples for t in bins]
    rest_expected = num_samples - sum(expected)
    observed.append(num_samples - sum(observed))
    expected.append(max(rest_expected, 1e-12))
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    degrees = len(bins)      # len(bins) + 1 cells, minus one
    return float(torch.special.gammaincc(torch.tensor(degrees / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


def test_plain_decoding_matches_the_exact_distribution(setup):
    """The yardstick itself: without speculation the engine's samples fit the computed distribution."""
    samples, engine, _ = sample(setup, None)
    assert engine.stats.drafts == 0
    for name in SETTINGS:
        assert chi_square_p_value(samples[name], setup.exact[name]) > SIGNIFICANCE, name


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_speculative_sampling_has_the_target_distribution(setup, drafter):
    samples, engine, per_request = sample(setup, setup.speculative[drafter])
    stats = engine.stats
    assert stats.drafts >= NUM_SEEDS, "drafting must actually happen for the test to mean anything"
    assert 0 < stats.accepted_tokens
    if drafter == "draft_same":
        assert stats.acceptance_rate > 0.95     # p_draft == p_target: (almost) every draft accepted
    else:
        assert stats.accepted_tokens < stats.draft_tokens
    for name in SETTINGS:
        assert chi_square_p_value(samples[name], setup.exact[name]) > SIGNIFICANCE, name
    # per-request counters add up to the engine-wide ones
    assert (per_request.drafts, per_request.draft_tokens, per_request.accepted_tokens,
            per_request.accepted_per_position) == (stats.drafts, stats.draft_tokens, stats.accepted_tokens,
                                                   stats.accepted_per_position)


def several_candidates_prompt(setup: Setup) -> list[int]:
    """The prompt with, after its first token, "t u v" for the 3 likeliest first tokens t and, after each, the
    3 likeliest second tokens u (v: the likeliest after them), least likely first: once the first output
    token is one of the t, lookahead's pool holds 3 candidates after it, the likeliest newest."""
    plain = SamplingParams(temperature=1.0)
    firsts = setup.next_probs([setup.prompt], plain)[0].topk(3).indices.tolist()
    seconds = setup.next_probs([setup.prompt + [t] for t in firsts], plain).topk(3, dim=1).indices.tolist()
    pairs = [(t, u) for t, us in zip(firsts, seconds) for u in us]
    thirds = setup.next_probs([setup.prompt + list(pair) for pair in pairs], plain).argmax(dim=1).tolist()
    inserted = [token for (t, u), v in reversed(list(zip(pairs, thirds))) for token in (t, u, v)]
    return setup.prompt[:1] + inserted + setup.prompt[1:]


@pytest.mark.parametrize("broken", [False, True], ids=["exact", "broken_recovery"])
def test_lookahead_tries_of_several_candidates_have_the_target_distribution(setup, monkeypatch, broken):
    """Draft tries with several children of the last token: the multi-draft walk, later siblings accepted
    after earlier ones were rejected, and their K/V moved into place; the same chi-square check, which
    rejects decisively when the recovered token comes from the target instead of the residual."""
    if broken:
        monkeypatch.setattr(rejection, "RESIDUAL_MASS_FLOOR", 2.0)      # every residual counts as empty
    prompt = several_candidates_prompt(setup)
    roots = Counter()

    def watch(proposal):
        for tree in proposal.trees or []:
            if tree is not None:
                roots[sum(parent == -1 for parent in tree.parents)] += 1
        return proposal

    samples, engine, _ = sample(setup, "lookahead:2,3,4", prompt, watch)
    assert sum(count for children, count in roots.items() if children >= 3) >= NUM_SEEDS, roots
    assert 0 < engine.stats.accepted_tokens < engine.stats.draft_tokens
    p_values = [chi_square_p_value(samples[name], setup.tuple_probs(SamplingParams(**setting), prompt))
                for name, setting in SETTINGS.items()]
    if broken:
        assert min(p_values) < BROKEN_SIGNIFICANCE, p_values
    else:
        assert min(p_values) > SIGNIFICANCE, p_values


def accept_everything(target_probs, draft_token_ids, draft_probs, greedy, uniforms):
    return torch.ones(draft_token_ids.shape, dtype=torch.bool, device=draft_token_ids.device)


def recover_from_target(draft_probs, draft_token_ids, positions, like):
    return torch.zeros_like(like)      # residual max(p_target - 0, 0) = p_target


# (planted bug, rejection-module function replaced, replacement, drafter); p_draft == p_target would hide
# both bugs, so draft_same is not here. The slow cases have smaller, still decisive, effects.
BROKEN = [pytest.param("_acceptance", accept_everything, "ngram", id="accept_everything-ngram"),
          pytest.param("_draft_probs_at", recover_from_target, "ngram", id="recover_from_target-ngram"),
          pytest.param("_acceptance", accept_everything, "draft_near", id="accept_everything-draft_near",
                       marks=pytest.mark.slow),
          pytest.param("_draft_probs_at", recover_from_target, "draft_near", id="recover_from_target-draft_near",
                       marks=pytest.mark.slow),
          pytest.param("_acceptance", accept_everything, "layer_skip", id="accept_everything-layer_skip",
                       marks=pytest.mark.slow),
          pytest.param("_draft_probs_at", recover_from_target, "eagle", id="recover_from_target-eagle"),
          pytest.param("_draft_probs_at", recover_from_target, "medusa", id="recover_from_target-medusa",
                       marks=pytest.mark.slow)]


@pytest.mark.parametrize("name, replacement, drafter", BROKEN)
def test_a_broken_verifier_fails_the_same_check(setup, monkeypatch, name, replacement, drafter):
    monkeypatch.setattr(rejection, name, replacement)
    samples, _, _ = sample(setup, setup.speculative[drafter])
    p_values = [chi_square_p_value(samples[setting], setup.exact[setting]) for setting in SETTINGS]
    assert min(p_values) < BROKEN_SIGNIFICANCE, p_values
