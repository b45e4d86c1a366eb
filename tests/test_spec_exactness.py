"""Greedy speculative decoding is lossless: token for token the output of the target alone.

For every drafter (n-gram lookup; a draft model with the target's own weights, which
the target accepts almost always; a different random draft model, which it almost
never accepts; layer_skip:1; suffix, whose global cache drafts later requests from earlier
responses; lookahead, whose k picks its sizes W,N,G = 1,2,1 / 3,3,3 / 5,4,5, so draft trees
of several candidates and a Jacobi window go through the same checks) and k in {1, 3, 5},
on a tiny random fp32 target:

  - at batch 1 and inside a continuous batch whose requests have mixed prompt and
    output lengths, join while others run, and include requests that opt out of
    speculation (SamplingParams(speculative=False)) or stop on a stop token or a stop
    string in the middle of a multi-token step, every request's output (token ids and
    text) equals the reference
    (the same request decoded alone by an engine without speculation);
  - drafting actually happened (engine.stats.drafts > 0, and the acceptance is high or
    low as the drafter implies), so a test that passes has exercised accepted,
    recovered and bonus tokens;
  - after every step no sequence holds KV blocks past its tokens (the unused lookahead
    was given back), the block manager's invariants hold, and at the end every block
    is free, also when a tiny KV cache forces preemptions;
  - per-request counters (RequestOutput.spec) add up to the engine-wide engine.stats,
    and they describe what was emitted: each step of a request emits its accepted
    drafts + 1 tokens, so the definitions of acceptance rate and mean acceptance
    length hold on the counters.

The default model (SmolLM2-135M, integration-marked) gets the same greedy check with
ngram and layer_skip on a few prompts, code among them.
"""

from pathlib import Path

import pytest

from specwise.config import EngineConfig
from specwise.engine.llm import LLM
from specwise.engine.llm_engine import LLMEngine
from specwise.engine.spec_decode.metrics import SpecStats
from specwise.models.checkpoints.loader import load_checkpoint
from specwise.models.config import ModelConfig
from specwise.sampling_params import SamplingParams
from tiny_checkpoints import make_tiny_hf_config, write_hf_checkpoint
from tiny_models import random_weights

TARGET_LAYERS = 3
ENGINE = dict(dtype="float32", num_kv_blocks=256, block_size=4, max_model_len=128, max_num_batched_tokens=512)
PROMPTS = [   # (text, max_tokens): mixed prompt and output lengths, repeats for the n-gram drafter
    ("def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return", 40),
    ("The quick brown fox jumps over the lazy dog. The quick brown fox", 28),
    ("x", 33),
    ("Speculative decoding drafts several tokens and the target model verifies them in one forward pass. "
     "Speculative decoding drafts", 24),
    ("for i in range(10):\n    print(add(i, 2 * i))\nfor i in range(10):\n", 36),
    ("Numbers: 12345, 2024-06-01, 3.14159", 19),
]
BATCH_ONE_PROMPTS = [0, 2, 3]   # indices into PROMPTS (the continuous batch runs them all)
DRAFTERS = ["ngram", "draft_same", "draft_other", "layer_skip", "suffix", "lookahead"]
SLOW = pytest.mark.slow


def cases(*names_and_ks, slow=()):
    """pytest params (drafter, k); those in `slow` are marked slow (the draft_other model drafts k tokens for
    nothing, the slowest case, and is covered by faster cases elsewhere)."""
    return [pytest.param(*case, marks=SLOW if case in slow else (), id="-".join(map(str, case)))
            for case in names_and_ks]


def greedy(max_tokens: int, **overrides) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **overrides)


def write_tiny_model(directory: Path, seed: int, num_layers: int) -> Path:
    config = make_tiny_hf_config(num_hidden_layers=num_layers)
    return write_hf_checkpoint(directory, config, random_weights(ModelConfig.from_hf(config), seed))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The target checkpoint and the --speculative text of each drafter."""
    root = tmp_path_factory.mktemp("spec_exactness")
    target_path = write_tiny_model(root / "target", seed=0, num_layers=TARGET_LAYERS)
    other_path = write_tiny_model(root / "other", seed=7, num_layers=1)
    speculative = {"ngram": "ngram", "draft_same": f"draft:{target_path}", "draft_other": f"draft:{other_path}",
                   "layer_skip": "layer_skip:1", "suffix": "suffix", "lookahead": "lookahead"}
    return load_checkpoint(target_path), speculative


def speculative_text(speculative: dict, drafter: str, k: int) -> str:
    """lookahead ignores k: k picks its sizes instead (W = G = k, N = k // 2 + 2)."""
    return f"lookahead:{k},{k // 2 + 2},{k}" if drafter == "lookahead" else speculative[drafter]


@pytest.fixture(scope="module")
def references(models):
    """Each prompt decoded alone without speculation, and prompt 0 cut by a stop token and by a stop string.

    Returns {"outputs": [token ids per prompt], "stop_token": id, "stop_string": text,
    "stop-token": (token ids, text), "stop-string": (token ids, text)}.
    """
    target, _ = models
    llm = LLM(checkpoint=target, **ENGINE)
    outputs = [llm.generate(text, greedy(max_tokens))[0].output_token_ids for text, max_tokens in PROMPTS]
    text, max_tokens = PROMPTS[0]
    # a stop token / string first completed well inside the output, so that a multi-token step must be cut there
    stop_token = next(token for token in outputs[0][8:] if token not in outputs[0][:8])
    pieces = [target.tokenizer.decode([token]) for token in outputs[0]]
    stop_string = next(piece for index, piece in enumerate(pieces) if index >= 9 and piece.strip()
                       and piece not in "".join(pieces[:index]))
    result = {"outputs": outputs, "stop_token": stop_token, "stop_string": stop_string}
    for name, params in (("stop-token", greedy(max_tokens, stop_token_ids=[stop_token])),
                         ("stop-string", greedy(max_tokens, stop=[stop_string]))):
        stopped = llm.generate(text, params)[0]
        assert stopped.finish_reason == "stop" and 8 < len(stopped.output_token_ids) < len(outputs[0])
        result[name] = (stopped.output_token_ids, stopped.text)
    return result


def make_engine(models, drafter: str, k: int, **overrides) -> LLMEngine:
    target, speculative = models
    config = EngineConfig(speculative=speculative_text(speculative, drafter, k), num_speculative_tokens=k,
                          **{**ENGINE, **overrides})
    return LLMEngine(config, target)


def check_blocks(engine: LLMEngine) -> None:
    """Invariants hold and no running sequence keeps lookahead blocks past its tokens (rollback)."""
    manager = engine.block_manager
    manager.check_invariants()
    for seq in engine.scheduler.running:
        assert len(seq.block_table) <= manager.blocks_for(len(seq)), "lookahead blocks not given back"
    for seq in engine.scheduler.waiting:
        assert not seq.block_table


def check_all_free(engine: LLMEngine) -> None:
    assert not engine.has_unfinished()
    engine.block_manager.check_invariants()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert not engine.block_manager.holders
    for name in ("pending", "requests", "states"):  # draft model / suffix / lookahead: per-sequence records
        assert not getattr(engine.proposer, name, None), "the drafter kept state for finished sequences"


def run(engine: LLMEngine, arrivals: list[tuple[int, str, str, SamplingParams]]):
    """Drive add_request/step: arrivals (step, request_id, prompt, params) join at that step.

    Returns {request_id: [RequestOutput of every step]}, checking the KV blocks after each step.
    """
    arrivals = sorted(arrivals, key=lambda arrival: arrival[0])
    outputs: dict[str, list] = {}
    step = 0
    while arrivals or engine.has_unfinished():
        while arrivals and arrivals[0][0] <= step:
            _, request_id, prompt, params = arrivals.pop(0)
            engine.add_request(prompt, params, request_id=request_id)
            outputs[request_id] = []
        for output in engine.step():
            outputs[output.request_id].append(output)
        check_blocks(engine)
        step += 1
    check_all_free(engine)
    return outputs


def check_counters(engine: LLMEngine, outputs: dict[str, list]) -> None:
    """Per-request counters sum to engine.stats and match the tokens each step emitted."""
    total = SpecStats()
    for request_id, steps in outputs.items():
        final = steps[-1]
        assert final.finished
        total = total.merge(final.spec)
        # new tokens per step add up to the output
        assert sum(len(step.new_token_ids) for step in steps) == len(final.output_token_ids)
        if final.finish_reason == "length":     # nothing cut by a stop: each step emitted accepted + 1
            previous = SpecStats()
            for step in steps:
                accepted_now = step.spec.accepted_tokens - previous.accepted_tokens
                drafted_now = step.spec.draft_tokens - previous.draft_tokens
                assert len(step.new_token_ids) == accepted_now + 1
                assert step.spec.drafts - previous.drafts == (1 if drafted_now else 0)
                previous = step.spec
    stats = engine.stats
    assert (total.drafts, total.draft_tokens, total.accepted_tokens, total.accepted_per_position) == \
           (stats.drafts, stats.draft_tokens, stats.accepted_tokens, stats.accepted_per_position)
    if stats.drafts:
        assert stats.acceptance_rate == pytest.approx(stats.accepted_tokens / stats.draft_tokens)
        assert stats.mean_acceptance_length == pytest.approx(1 + stats.accepted_tokens / stats.drafts)
        assert sum(stats.per_position_acceptance) == pytest.approx(stats.mean_acceptance_length - 1)


def check_acceptance(drafter: str, stats: SpecStats) -> None:
    """Drafting happened, and accepted as the drafter implies."""
    assert stats.drafts > 0
    if drafter == "draft_same":
        assert stats.acceptance_rate > 0.9        # the target's own weights: bonus tokens
    elif drafter == "draft_other":
        assert stats.acceptance_rate < 0.3        # an unrelated model: recovered tokens
    else:
        assert stats.accepted_tokens > 0


ALL_CASES = [(drafter, k) for drafter in DRAFTERS for k in (1, 3, 5)]


@pytest.mark.parametrize("drafter, k", cases(*ALL_CASES, slow=[case for case in ALL_CASES if case[1] != 3
                                                               or case[0] == "draft_other"]))
def test_greedy_output_equals_the_target_alone_at_batch_one(models, references, drafter, k):
    engine = make_engine(models, drafter, k)
    expected = references["outputs"]
    outputs = {}
    for index in BATCH_ONE_PROMPTS:
        text, max_tokens = PROMPTS[index]
        outputs.update(run(engine, [(0, f"r{index}", text, greedy(max_tokens))]))
        assert outputs[f"r{index}"][-1].output_token_ids == expected[index], f"prompt {index}"
    check_acceptance(drafter, engine.stats)
    check_counters(engine, outputs)


def continuous_batch(references):
    """Arrivals: mixed lengths, joining mid-way; two requests opt out of speculation, one stops on a token
    and one on a stop string (both usually in the middle of a multi-token step)."""
    arrivals = []
    for index, (step, text_index, speculative) in enumerate([(0, 0, True), (0, 2, True), (2, 1, False),
                                                             (3, 3, True), (5, 4, True), (9, 5, False),
                                                             (12, 2, True)]):
        text, max_tokens = PROMPTS[text_index]
        arrivals.append((step, f"r{index}-p{text_index}", text, greedy(max_tokens, speculative=speculative)))
    text, max_tokens = PROMPTS[0]
    arrivals.append((4, "stop-token", text, greedy(max_tokens, stop_token_ids=[references["stop_token"]])))
    arrivals.append((6, "stop-string", text, greedy(max_tokens, stop=[references["stop_string"]])))
    return arrivals


def expected_output(references, request_id: str) -> list[int]:
    if request_id.startswith("stop"):
        return references[request_id][0]
    return references["outputs"][int(request_id.rpartition("-p")[2])]


@pytest.mark.parametrize("drafter, k", cases(*ALL_CASES, slow=[("draft_other", 5)]))
def test_greedy_output_equals_the_target_alone_in_a_continuous_batch(models, references, drafter, k):
    engine = make_engine(models, drafter, k)
    outputs = run_continuous_batch_exactly(engine, references)
    check_acceptance(drafter, engine.stats)
    check_counters(engine, outputs)


def run_continuous_batch_exactly(engine, references) -> dict:
    """Run the continuous batch (joins, opt-outs, stop strings); every request's greedy output is the
    target's alone, opted-out requests were never drafted for, stops end with "stop". Returns the outputs."""
    arrivals = continuous_batch(references)
    outputs = run(engine, arrivals)
    for _, request_id, _, params in arrivals:
        final = outputs[request_id][-1]
        assert final.output_token_ids == expected_output(references, request_id), request_id
        if not params.speculative:
            assert final.spec.drafts == 0, f"{request_id} opted out of speculation but was drafted for"
    for name in ("stop-token", "stop-string"):
        assert outputs[name][-1].finish_reason == "stop"
        assert outputs[name][-1].text == references[name][1], name
    return outputs


@pytest.mark.parametrize("drafter", ["ngram", "draft_same", pytest.param("draft_other", marks=SLOW), "layer_skip",
                                     "suffix", "lookahead"])
def test_preemption_under_a_tiny_kv_cache_keeps_output_exact_and_frees_every_block(models, references, drafter):
    # 6 requests of up to ~60 tokens (15 blocks each) against 40 blocks: lookahead is shed and
    # the newest sequences are preempted and recomputed, some more than once
    engine = make_engine(models, drafter, 3, num_kv_blocks=40)
    arrivals = [(0, f"r{index}-p{index}", text, greedy(max_tokens)) for index, (text, max_tokens) in
                enumerate(PROMPTS)]
    sequences = []
    original_add = engine.scheduler.add

    def remember(seq):
        sequences.append(seq)
        original_add(seq)

    engine.scheduler.add = remember
    outputs = run(engine, arrivals)
    for _, request_id, _, _ in arrivals:
        assert outputs[request_id][-1].output_token_ids == expected_output(references, request_id), request_id
    assert sum(seq.num_preemptions for seq in sequences) > 0, "the KV cache was big enough: nothing preempted"
    assert engine.stats.drafts > 0
    check_counters(engine, outputs)


@pytest.mark.parametrize("drafter", [pytest.param("ngram", marks=SLOW), "draft_same", "draft_other", "layer_skip",
                                     "lookahead"])
def test_k_changing_from_step_to_step_keeps_output_exact(models, references, drafter):
    """A k table (the batch size picks k: 5 alone, 2 from 3 sequences on, off from 5) changes k as requests
    join and leave: drafter state kept from a longer or an empty step must still be handled."""
    engine = make_engine(models, drafter, 5, speculative_policy="table:1=5/3=2/5=0")
    asked = []
    propose = engine.proposer.propose

    def recording_propose(seqs, num_draft_tokens):
        asked.append(max(num_draft_tokens))
        return propose(seqs, num_draft_tokens)

    engine.proposer.propose = recording_propose
    arrivals = continuous_batch(references)
    outputs = run(engine, arrivals)
    for _, request_id, _, _ in arrivals:
        assert outputs[request_id][-1].output_token_ids == expected_output(references, request_id), request_id
    assert {2, 5} <= set(asked), asked
    assert engine.stats.drafts > 0
    check_counters(engine, outputs)


def test_switching_drafters_between_requests_on_one_engine(models, references):
    """set_speculative (how the evaluator runs every arm on one load) keeps exactness and frees state."""
    engine = make_engine(models, "ngram", 3)
    expected = references["outputs"]
    text, max_tokens = PROMPTS[0]
    for drafter, k in [("ngram", 3), ("layer_skip", 2), ("lookahead", 3), ("draft_same", 4), (None, 4),
                       ("draft_other", 1)]:
        engine.set_speculative(None if drafter is None else speculative_text(models[1], drafter, k), k)
        outputs = run(engine, [(0, f"{drafter}-{k}", text, greedy(max_tokens))])
        assert outputs[f"{drafter}-{k}"][-1].output_token_ids == expected[0], drafter


# --------------------------------------------------------------------------- the real default model

REAL_PROMPTS = [
    [{"role": "user", "content": "Rename the variable `total` to `sum_of_items` in this code and return the "
                                 "whole function:\n\ndef add_all(items):\n    total = 0\n    for item in items:\n"
                                 "        total += item\n    return total\n"}],
    [{"role": "user", "content": "Summarize in one sentence: The city council met on Tuesday to discuss the "
                                 "new bike lanes. Residents spoke for and against the plan. The council voted "
                                 "to build the lanes next spring."}],
    "Once upon a time, in a small village by the sea,",
]


REAL_PARAMS = SamplingParams(temperature=0, max_tokens=40)


@pytest.fixture(scope="module")
def real_llm():
    return LLM(dtype="float32", max_model_len=512, num_kv_blocks=128)


@pytest.fixture(scope="module")
def real_reference(real_llm):
    real_llm.engine.set_speculative(None, 4)
    return [output.output_token_ids for output in real_llm.generate(REAL_PROMPTS, REAL_PARAMS)]


# SmolLM2-135M was not trained for early exit: its first 8 / 15 / 22 / 26 of 30 layers draft tokens the
# target accepts ~0% / 3% / 9% / 22% of the time (greedy, code and chat prompts), so layer_skip uses 26
@pytest.mark.integration
@pytest.mark.parametrize("speculative, k", [("ngram", 4), ("layer_skip:26", 3), ("lookahead", 4)])
def test_greedy_exact_on_the_default_model(real_llm, real_reference, speculative, k):
    engine = real_llm.engine
    expected = real_reference
    engine.set_speculative(speculative, k)
    before = engine.stats.copy()
    outputs = real_llm.generate(REAL_PROMPTS, REAL_PARAMS)
    for index, output in enumerate(outputs):
        assert output.output_token_ids == expected[index], f"prompt {index}"
    assert engine.stats.drafts > before.drafts
    assert engine.stats.accepted_tokens > before.accepted_tokens
    check_all_free(engine)
