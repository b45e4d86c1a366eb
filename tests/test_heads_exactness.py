"""EAGLE and Medusa heads in the engine: greedy output is token for token the target's own.

Heads fitted for a few steps to the target's greedy text (tests/head_training.py) on half of
the prompts, so they draft what the target says often but not always: every run below sees
accepted drafts and rejected ones (recovered tokens). On the tiny random target of
tests/test_spec_exactness.py, with its helpers and references (each prompt decoded alone
without speculation):

  - batch 1 and a continuous batch (joins, opt-outs, a stop token and a stop string cutting a
    multi-token step), at every k from 1 to the most the drafter takes (16 for EAGLE, the
    number of heads for Medusa; most of them slow-marked);
  - preemption under a tiny KV cache, k changing from step to step, switching drafters;
  - the features EAGLE pairs are the target's own (rejected drafts' rows dropped), and every
    per-sequence record is gone once its request ends.

The default model (integration-marked) gets the same greedy check with fitted heads, and
draft:DIR with a draft model made of the target's first layers.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch

from draft_dirs import write_first_layers_draft
from head_training import aux_of, features_of, fitted_head_dir, greedy_texts
from specwise.bench.load.arms import parse_methods
from specwise.cli import main
from specwise.config import MAX_SPECULATIVE_TOKENS, EngineConfig
from specwise.engine.llm_engine import LLMEngine
from specwise.engine.model_runner import ModelRunner
from specwise.engine.sequence import Sequence
from specwise.engine.spec_decode.config import SpeculativeConfig
from specwise.engine.spec_decode.context import ProposerContext
from specwise.engine.spec_decode.draft_sampler import DraftSampler
from specwise.engine.spec_decode.heads import OUTSIDE_MARGIN, DraftLMHead
from specwise.errors import ConfigError, ModelLoadError
from specwise.models.checkpoints.loader import build_model, load_checkpoint
from specwise.models.heads.builtin import HEADS_PATH_VARIABLE, find_builtin_head
from specwise.sampling_params import SamplingParams
from tiny_models import tiny_checkpoint
from capability_marks import cpu_kernels
from test_spec_exactness import (BATCH_ONE_PROMPTS, ENGINE, PROMPTS, REAL_PARAMS, REAL_PROMPTS,  # noqa: F401
                                 TARGET_LAYERS, check_all_free, check_counters, expected_output, greedy, real_llm,
                                 real_reference, references, run, run_continuous_batch_exactly, write_tiny_model)

pytestmark = cpu_kernels

MEDUSA_HEADS = 5
DRAFTERS = {"eagle": MAX_SPECULATIVE_TOKENS, "eagle3": MAX_SPECULATIVE_TOKENS, "medusa": MEDUSA_HEADS}   # -> largest k
DEFAULT_KS = {"eagle": (1, 3, 16), "eagle3": (2, 16), "medusa": (1, 3, 5)}          # the rest are slow


def k_cases(default_ks=DEFAULT_KS):
    return [pytest.param(drafter, k, id=f"{drafter}-{k}",
                         marks=() if k in default_ks[drafter] else pytest.mark.slow)
            for drafter, max_k in DRAFTERS.items() for k in range(1, max_k + 1)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The target and the --speculative text of each head (fitted on prompts 0, 2, 4), plus the dirs."""
    root = tmp_path_factory.mktemp("heads_exactness")
    target = load_checkpoint(write_tiny_model(root / "target", seed=0, num_layers=TARGET_LAYERS))
    model = build_model(target, torch.float32, "cpu", ENGINE["max_model_len"], plain=True)   # trains heads
    texts = greedy_texts(model, [target.tokenizer.encode(text) for text, _ in PROMPTS[::2]], max_tokens=40)
    eagle = fitted_head_dir(root / "eagle", "eagle", target, model, texts, steps=100)
    medusa = fitted_head_dir(root / "medusa", "medusa", target, model, texts, steps=300, num_heads=MEDUSA_HEADS)
    eagle3 = fitted_head_dir(root / "eagle3", "eagle3", target, model, texts, steps=100)
    # the same EAGLE head drafting only from the tokens its texts hold (as a trainer would list them), and
    # from tokens the target never says there: every draft rejected, the output still the target's
    seen = sorted({token for text in texts for token in text})
    unseen = sorted(set(range(target.config.vocab_size)) - {token for output in texts for token in output})[:50]
    eagle_vocab = fitted_head_dir(root / "eagle_vocab", "eagle", target, model, texts, steps=100, draft_vocab=seen)
    eagle_unseen = fitted_head_dir(root / "eagle_unseen", "eagle", target, model, texts, steps=100,
                                   draft_vocab=unseen)
    return target, {"eagle": f"eagle:{eagle}", "eagle3": f"eagle3:{eagle3}", "medusa": f"medusa:{medusa}",
                    "ngram": "ngram",
                    "eagle_vocab": f"eagle:{eagle_vocab}", "eagle_unseen": f"eagle:{eagle_unseen}"}


def make_engine(models, drafter: str, k: int, **overrides) -> LLMEngine:
    target, speculative = models
    return LLMEngine(EngineConfig(speculative=speculative[drafter], num_speculative_tokens=k,
                                  **{**ENGINE, **overrides}), target)


def check_drafted(engine: LLMEngine) -> None:
    """Drafts were both accepted and rejected, and no per-sequence record outlived its request."""
    stats = engine.stats
    assert stats.drafts > 0 and 0 < stats.accepted_tokens < stats.draft_tokens, stats.to_dict()
    assert not getattr(engine.proposer, "states", None) and not getattr(engine.proposer, "last_run", None)
    assert not engine.proposer.sampler.generators


@pytest.mark.parametrize("drafter, k", k_cases({"eagle": (1, 4), "eagle3": (1, 4), "medusa": (1, 5)}))
def test_greedy_output_equals_the_target_alone_at_batch_one(models, references, drafter, k):
    engine = make_engine(models, drafter, k)
    outputs = {}
    for index in BATCH_ONE_PROMPTS:
        text, max_tokens = PROMPTS[index]
        outputs.update(run(engine, [(0, f"r{index}", text, greedy(max_tokens))]))
        assert outputs[f"r{index}"][-1].output_token_ids == references["outputs"][index], f"prompt {index}"
    check_drafted(engine)
    check_counters(engine, outputs)


@pytest.mark.parametrize("drafter, k", k_cases())
def test_greedy_output_equals_the_target_alone_in_a_continuous_batch(models, references, drafter, k):
    engine = make_engine(models, drafter, k)
    outputs = run_continuous_batch_exactly(engine, references)
    check_drafted(engine)
    check_counters(engine, outputs)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_preemption_under_a_tiny_kv_cache_keeps_output_exact(models, references, drafter):
    # as in test_spec_exactness: 6 requests against 40 blocks, the newest preempted and recomputed
    engine = make_engine(models, drafter, 3, num_kv_blocks=40)
    sequences = []
    original_add = engine.scheduler.add
    engine.scheduler.add = lambda seq: (sequences.append(seq), original_add(seq))
    arrivals = [(0, f"r{index}-p{index}", text, greedy(max_tokens)) for index, (text, max_tokens) in
                enumerate(PROMPTS)]
    outputs = run(engine, arrivals)
    for _, request_id, _, _ in arrivals:
        assert outputs[request_id][-1].output_token_ids == expected_output(references, request_id), request_id
    assert sum(seq.num_preemptions for seq in sequences) > 0, "the KV cache was big enough: nothing preempted"
    check_drafted(engine)
    check_counters(engine, outputs)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_k_changing_from_step_to_step_keeps_output_exact(models, references, drafter):
    """k 5 alone, 2 from 3 sequences on, off from 5: the head's state must survive steps without drafts."""
    engine = make_engine(models, drafter, 5, speculative_policy="table:1=5/3=2/5=0")
    outputs = run_continuous_batch_exactly(engine, references)
    check_drafted(engine)
    check_counters(engine, outputs)


def test_a_draft_vocabulary_keeps_output_exact_and_drafts_only_from_it(models, references):
    engine = make_engine(models, "eagle_vocab", 3)
    drafted = set()
    propose = engine.proposer.propose

    def recording_propose(seqs, num_draft_tokens):
        proposal = propose(seqs, num_draft_tokens)
        drafted.update(token for row in proposal.draft_token_ids for token in row)
        return proposal

    engine.proposer.propose = recording_propose
    outputs = run_continuous_batch_exactly(engine, references)
    check_drafted(engine)
    check_counters(engine, outputs)
    vocab = set(engine.proposer.lm_head.draft_vocab.tolist())
    assert drafted and drafted <= vocab and len(vocab) < engine.model.config.vocab_size


def test_a_draft_vocabulary_the_target_never_uses_is_rejected_every_time_yet_exact(models, references):
    engine = make_engine(models, "eagle_unseen", 3)
    run_continuous_batch_exactly(engine, references)
    assert engine.stats.draft_tokens > 0 and engine.stats.accepted_tokens == 0


def test_switching_drafters_drops_the_previous_feature_observer(models, references):
    engine = make_engine(models, "eagle", 3)
    text, max_tokens = PROMPTS[0]
    for drafter, observers in [("eagle3", 1), ("medusa", 1), ("ngram", 0), ("eagle", 1), (None, 0)]:
        engine.set_speculative(None if drafter is None else models[1][drafter], 3)
        assert len(engine.runner.feature_observers) == observers, drafter
        assert bool(engine.runner.feature_layers) == (drafter == "eagle3"), drafter     # residual streams read
        outputs = run(engine, [(0, f"{drafter}", text, greedy(max_tokens))])
        assert outputs[f"{drafter}"][-1].output_token_ids == references["outputs"][0], drafter


@pytest.mark.parametrize("drafter", ["eagle", "eagle3"])
def test_the_features_eagle_pairs_are_the_targets_own(models, drafter):
    """After every step the features kept below num_computed_tokens equal the target's, computed afresh
    over the whole sequence: chunked prompts are placed right and rejected drafts' rows are dropped.
    EAGLE-3's are the residual streams of its three layers."""
    engine = make_engine(models, drafter, 4, max_num_batched_tokens=16)      # prompts in chunks of <= 16
    model = engine.model
    layers = engine.proposer.aux_layers
    of = (lambda tokens: features_of(model, tokens)) if layers is None else (lambda tokens: aux_of(model, tokens,
                                                                                                   layers))
    for index, (text, max_tokens) in enumerate(PROMPTS[:4]):
        engine.add_request(text, greedy(max_tokens), request_id=f"r{index}")
    checked = 0
    while engine.has_unfinished():
        engine.step()
        for seq in engine.scheduler.running:
            state = engine.proposer.states.get(seq.seq_id)
            if state is None or not state.segments:
                continue
            start, end = state.segments[0][0], seq.num_computed_tokens
            expected = of(seq.token_ids)[start:end]
            torch.testing.assert_close(state.features(start, end), expected, rtol=1e-4, atol=1e-4)
            checked += 1
    assert checked > 20 and engine.stats.accepted_tokens < engine.stats.draft_tokens


def test_medusa_k_above_its_heads_is_a_one_line_error(models):
    directory = models[1]["medusa"].partition(":")[2]
    with pytest.raises(ConfigError, match=f"{directory}: these medusa heads draft at most {MEDUSA_HEADS} tokens"):
        make_engine(models, "medusa", MEDUSA_HEADS + 1)


def test_a_head_of_the_other_kind_is_refused_naming_the_directory(models):
    target, speculative = models
    directory = speculative["medusa"].partition(":")[2]
    with pytest.raises(ConfigError, match="holds a 'medusa' head, not 'eagle'") as error:
        LLMEngine(EngineConfig(speculative=f"eagle:{directory}", **ENGINE), target)
    assert directory in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("text, method, head_dir, label", [
    ("eagle", "eagle", None, "eagle"), ("eagle:/heads/e1", "eagle", "/heads/e1", "eagle:/heads/e1"),
    ("medusa", "medusa", None, "medusa"), ("MEDUSA: m ", "medusa", "m", "medusa:m")])
def test_speculative_text_round_trips(text, method, head_dir, label):
    config = SpeculativeConfig.parse(text, 4)
    assert (config.method, config.head_dir, config.label) == (method, head_dir, label)
    assert SpeculativeConfig.parse(config.label, 4) == config


def test_a_head_directory_on_another_method_is_refused():
    with pytest.raises(ConfigError, match="only used by eagle:DIR, eagle3:DIR or medusa:DIR"):
        SpeculativeConfig("ngram", 4, head_dir="somewhere")


# --------------------------------------------------------------------------- built-in heads


def test_the_built_in_head_is_the_one_trained_for_the_target(models, tmp_path, monkeypatch):
    target, speculative = models
    eagle_dir = Path(speculative["eagle"].partition(":")[2])
    other = tmp_path / "other"
    (other / "a-wider").mkdir(parents=True)
    config = json.loads((Path(eagle_dir) / "drafter.json").read_text())
    config["target"]["hidden_size"] = 128
    (other / "a-wider" / "drafter.json").write_text(json.dumps(config))
    (other / "b-broken").mkdir()
    (other / "b-broken" / "drafter.json").write_text("{not json")
    heads = tmp_path / "heads"
    (heads / "tiny").mkdir(parents=True)
    shutil.copytree(eagle_dir, heads / "tiny" / "eagle")           # heads/<model>/<kind>/, as shipped
    assert find_builtin_head("eagle", target.config, target.tokenizer, [other]) is None
    found = heads / "tiny" / "eagle"
    assert find_builtin_head("eagle", target.config, target.tokenizer, [other, heads]) == found
    assert find_builtin_head("medusa", target.config, target.tokenizer, [other, heads]) is None
    monkeypatch.setenv(HEADS_PATH_VARIABLE, str(heads))
    engine = LLMEngine(EngineConfig(speculative="eagle", num_speculative_tokens=3, **ENGINE), target)
    assert engine.proposer.directory == found


def test_no_built_in_head_for_the_target_says_how_to_train_one(models, monkeypatch, tmp_path):
    target, _ = models
    monkeypatch.setenv(HEADS_PATH_VARIABLE, str(tmp_path))
    with pytest.raises(ConfigError, match="no built-in medusa head for this target") as error:
        LLMEngine(EngineConfig(speculative="medusa", **ENGINE), target)
    assert "specwise train-drafter --kind medusa" in str(error.value) and "\n" not in str(error.value)


# --------------------------------------------------------------------------- the real default model

REAL_MEDUSA_HEADS = 3
# SmolLM2-135M's first layers draft tokens its 30 accept sometimes (22% at 26 layers, see test_spec_exactness):
# enough accepted and rejected drafts for the identity check to bite
REAL_DRAFT_LAYERS = 26


@pytest.fixture(scope="module")
def real_texts(real_llm, real_reference):
    """Prompt + the target's greedy output, token ids, for each of REAL_PROMPTS."""
    engine = real_llm.engine
    return [engine.prepare(prompt) + output for prompt, output in zip(REAL_PROMPTS, real_reference)]


@pytest.fixture(scope="module")
def real_drafters(real_llm, real_texts, tmp_path_factory):
    """--speculative texts on the default model: heads fitted for a few steps on its own text for two of the
    prompts, and a draft model of its first layers."""
    root = tmp_path_factory.mktemp("real_drafters")
    checkpoint = load_checkpoint(None)
    model = real_llm.engine.model
    seen = real_texts[:2]                        # the third prompt's text is new to the heads: rejections
    eagle = fitted_head_dir(root / "eagle", "eagle", checkpoint, model, seen, steps=80)
    medusa = fitted_head_dir(root / "medusa", "medusa", checkpoint, model, seen, steps=24,
                             num_heads=REAL_MEDUSA_HEADS)
    draft = write_first_layers_draft(checkpoint, REAL_DRAFT_LAYERS, root / "draft")
    return {"eagle": f"eagle:{eagle}", "medusa": f"medusa:{medusa}", "draft": f"draft:{draft}",
            "shipped_eagle": "eagle"}           # the head shipped in specwise/models/heads/


@pytest.mark.integration
@pytest.mark.parametrize("drafter, k", [("eagle", 4), ("medusa", REAL_MEDUSA_HEADS), ("draft", 3),
                                        ("shipped_eagle", 4)])
def test_greedy_exact_on_the_default_model(real_llm, real_reference, real_drafters, drafter, k):
    engine = real_llm.engine
    engine.set_speculative(real_drafters[drafter], k)
    before = engine.stats.copy()
    outputs = real_llm.generate(REAL_PROMPTS, REAL_PARAMS)
    for index, output in enumerate(outputs):
        assert output.output_token_ids == real_reference[index], f"prompt {index}"
    drafted = engine.stats.draft_tokens - before.draft_tokens
    accepted = engine.stats.accepted_tokens - before.accepted_tokens
    print(f"\n[{drafter} k={k}] accepted {accepted} of {drafted} drafts")
    assert 0 < accepted < drafted
    check_all_free(engine)


# --------------------------------------------------------------------------- the draft vocabulary's LM head


@pytest.mark.parametrize("dtype, quantization", [("float32", "none"), ("bfloat16", "none"), ("bfloat16", "int8")])
def test_the_draft_vocabulary_head_gives_the_targets_logits_there_and_a_finite_floor_elsewhere(dtype, quantization):
    """The rows copied from the target's LM head (plain, packed or int8: read through the module itself)
    give its logits at the draft vocabulary; every other token sits OUTSIDE_MARGIN below their lowest."""
    checkpoint = tiny_checkpoint()                              # untied LM head: no embedding to read it from
    model = build_model(checkpoint, getattr(torch, dtype), "cpu", 64, quantization)
    runner = ModelRunner(model, 4, 4, getattr(torch, dtype))
    context = ProposerContext(runner, checkpoint.tokenizer, getattr(torch, dtype), "cpu", 64)
    vocab = [3, 7, 100, 257]
    features = torch.randn(5, checkpoint.config.hidden_size).to(getattr(torch, dtype))
    with torch.inference_mode():
        full = model.compute_logits(features)                                           # [5, vocab]
        logits = DraftLMHead(model, vocab, context)(features)
        # without a draft vocabulary: the target's logits, as its runner computes them
        torch.testing.assert_close(DraftLMHead(model, None, context)(features), full, rtol=0, atol=0)
    tolerance = 1e-5 if dtype == "float32" else 0.05 * full.abs().max().item()
    torch.testing.assert_close(logits[:, vocab], full[:, vocab], rtol=0, atol=tolerance)
    outside = torch.ones(logits.shape[1], dtype=torch.bool)
    outside[vocab] = False
    floor = logits[:, vocab].amin(dim=1) - OUTSIDE_MARGIN
    assert torch.equal(logits[:, outside], floor.unsqueeze(1).expand(5, int(outside.sum())))
    masked = logits.clone()
    masked[:, vocab] = float("-inf")                            # a grammar that allows none of them
    assert torch.isfinite(torch.softmax(masked, dim=-1)).all()


def test_a_draft_vocabulary_outside_the_target_is_a_load_error(models, tmp_path):
    target, speculative = models
    directory = Path(speculative["eagle"].partition(":")[2])
    config = json.loads((directory / "drafter.json").read_text())
    config["draft_vocab"] = [1, target.config.vocab_size]
    copy = tmp_path / "eagle"
    shutil.copytree(directory, copy)
    (copy / "drafter.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=f"draft_vocab holds token id {target.config.vocab_size}, outside"):
        LLMEngine(EngineConfig(speculative=f"eagle:{copy}", **ENGINE), target)


# --------------------------------------------------------------------------- commands


def test_generate_drafts_with_a_head_and_refuses_bad_ones_in_one_line(models, capsys, tmp_path, monkeypatch):
    target, speculative = models
    small = ["--model", str(target.path), "--prompt", PROMPTS[0][0], "--max-tokens", "16", "--temperature", "0",
             "--num-kv-blocks", "64", "--max-model-len", "96", "--dtype", "float32"]
    assert main(["generate", *small, "--speculative", speculative["eagle"], "--num-speculative-tokens", "3"]) == 0
    assert "acceptance" in capsys.readouterr().err
    monkeypatch.setenv(HEADS_PATH_VARIABLE, str(tmp_path))
    for argv, fragment in [(["--speculative", f"eagle:{tmp_path / 'none'}"], "no such drafter directory"),
                           (["--speculative", speculative["medusa"], "--num-speculative-tokens", "6"],
                            "draft at most 5 tokens"),
                           (["--speculative", "eagle"], "no built-in eagle head for this target")]:
        assert main(["generate", *small, *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.startswith("specwise: error: ") and fragment in err, err


def test_evaluate_methods_take_heads():
    arms = parse_methods("off,eagle,medusa:/heads/m@3,eagle:/heads/e", 4)
    assert [(arm.name, arm.method, arm.spec, arm.k) for arm in arms] == [
        ("off", "off", None, 0), ("eagle-k4", "eagle", "eagle", 4), ("medusa-m-k3", "medusa", "medusa:/heads/m", 3),
        ("eagle-e-k4", "eagle", "eagle:/heads/e", 4)]


def test_eagle_drafts_for_an_int8_target_through_its_own_modules(models):
    """A quantized target: the head reads the target's int8 LM head and embedding as they are (no copies)."""
    engine = make_engine(models, "eagle", 3, dtype="bfloat16", quantization="int8")
    outputs = run(engine, [(0, "r0", PROMPTS[0][0], greedy(PROMPTS[0][1]))])
    assert len(outputs["r0"][-1].output_token_ids) == PROMPTS[0][1]
    assert engine.stats.accepted_tokens > 0


def test_greedy_drafts_are_the_processed_argmax_with_one_hot_probabilities(models):
    """All-greedy rows skip the softmax: the token is the argmax after penalties, its probabilities None
    (one-hot); a sampled row in the batch gets its distribution."""
    target, _ = models
    engine = LLMEngine(EngineConfig(**ENGINE), target)
    sampler = DraftSampler(engine.runner)
    penalised = Sequence("p", [5, 9], SamplingParams(temperature=0, repetition_penalty=100.0))
    sampled = Sequence("s", [5, 9], SamplingParams(temperature=1.0, seed=3))
    for seq in (penalised, sampled):
        engine.runner.processing.add(seq)
    logits = torch.zeros(2, target.config.vocab_size)
    logits[:, 9], logits[:, 4] = 2.0, 1.0                     # 9 wins unless the penalty pushes it down
    probs, tokens = sampler.sample(logits[:1], [penalised], [[]])
    assert probs == [None] and tokens == [4]
    probs, tokens = sampler.sample(logits, [penalised, sampled], [[], []])
    assert tokens[0] == 4 and probs[0][4] == 1.0 and probs[1].sum().item() == pytest.approx(1.0)
