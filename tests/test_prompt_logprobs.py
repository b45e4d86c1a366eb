"""Prompt logprobs (SamplingParams.prompt_logprobs) are the target's raw log_softmax at the prompt positions.

  - each prompt token after the first gets the logprob, and the top list, that one plain forward
    over the whole prompt gives at the position before it; the first token gets None;
  - the same with speculation (ngram), with chunked prefill (a prompt over several steps), inside
    a continuous batch whose other requests do not ask, and when a tiny KV cache preempts;
  - they arrive once, with the first output; the output tokens are those of a request that
    did not ask;
  - a request that does not ask costs no logits rows beyond its sampled positions.
"""

import pytest
import torch
from test_spec_exactness import ENGINE, PROMPTS, make_engine, models, run  # noqa: F401

from specwise.config import EngineConfig
from specwise.engine.llm_engine import LLMEngine
from specwise.sampling_params import SamplingParams

TOLERANCE = 1e-4
TOP = 3


def reference(engine: LLMEngine, token_ids: list[int]) -> torch.Tensor:
    """log_softmax of one forward over the whole prompt, on an idle engine: [len(token_ids), vocab]."""
    runner = engine.runner
    table = list(range(runner.blocks_for(len(token_ids))))
    logits = runner.forward([token_ids], [0], [table], [len(token_ids)])
    return torch.log_softmax(logits.float(), dim=-1)


@pytest.fixture(scope="module")
def expected(models):  # noqa: F811
    """{prompt index: (prompt token ids, reference logprobs [len, vocab], greedy output without asking)}."""
    engine = LLMEngine(EngineConfig(**ENGINE), models[0])
    result = {}
    for index, (text, max_tokens) in enumerate(PROMPTS):
        token_ids = engine.encode(text)
        engine.add_request(token_ids, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
        outputs = []
        while engine.has_unfinished():
            outputs += engine.step()
        result[index] = (token_ids, reference(engine, token_ids), outputs[-1].output_token_ids)
    return result


def check(expected: dict, outputs: dict) -> None:
    for request_id, steps in outputs.items():
        index, asked = int(request_id[1:]), request_id.startswith("p")
        token_ids, logprobs, output_ids = expected[index]
        assert steps[-1].output_token_ids == output_ids, request_id
        given = [step.prompt_logprobs for step in steps if step.prompt_logprobs is not None]
        if not asked:
            assert not given
            continue
        assert len(given) == 1 and steps[0].prompt_logprobs is given[0], "once, with the first output"
        prompt = given[0]
        assert len(prompt) == len(token_ids) and prompt[0] is None
        for position, item in enumerate(prompt[1:]):
            row = logprobs[position]                      # position p's logits give token p + 1
            assert item.token_id == token_ids[position + 1]
            assert item.logprob == pytest.approx(row[item.token_id].item(), abs=TOLERANCE)
            top_values, top_ids = row.topk(TOP)
            assert [t for t, _ in item.top][:2] == top_ids.tolist()[:2]
            assert [v for _, v in item.top] == pytest.approx(top_values.tolist(), abs=TOLERANCE)


def arrivals(ask: list[int], join_every: int = 1) -> list:
    """Every prompt, joining one per `join_every` steps; those in `ask` ask for prompt logprobs."""
    return [(index * join_every, f"{'p' if index in ask else 'q'}{index}", text,
             SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                            prompt_logprobs=TOP if index in ask else None))
            for index, (text, max_tokens) in enumerate(PROMPTS)]


CONFIGS = {
    "plain": dict(),
    "chunked": dict(max_num_batched_tokens=8),                 # prompts of up to 30 tokens over several steps
    "preempting": dict(num_kv_blocks=24, max_num_batched_tokens=16),
}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("speculative", [None, "ngram"])
def test_prompt_logprobs_equal_a_full_forward(models, expected, config, speculative):  # noqa: F811
    overrides = CONFIGS[config]
    if speculative is None:
        engine = LLMEngine(EngineConfig(**{**ENGINE, **overrides}), models[0])
    else:
        engine = make_engine(models, speculative, 3, **overrides)
    preempted = []
    preempt = engine.scheduler.preempt

    def noting(seq):
        preempted.append((seq.request_id, seq.num_output_tokens))
        preempt(seq)
    engine.scheduler.preempt = noting
    check(expected, run(engine, arrivals(ask=[0, 2, 3, 5])))
    if speculative is not None:
        assert engine.stats.accepted_tokens > 0
    if config == "preempting":        # a request that asked was preempted before its first output
        assert any(request_id.startswith("p") and not num_output for request_id, num_output in preempted)


def test_preempted_mid_prefill_keeps_what_it_held(models, expected):  # noqa: F811
    """Preempted after its first chunk, a prompt is recomputed from position 0: no entry twice, none lost."""
    engine = LLMEngine(EngineConfig(**{**ENGINE, "max_num_batched_tokens": 8}), models[0])
    text, max_tokens = PROMPTS[3]
    engine.add_request(text, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                                            prompt_logprobs=TOP), request_id="p3")
    outputs = {"p3": engine.step() + engine.step()}            # two chunks of 8, no output yet
    seq = engine.requests["p3"]
    assert not outputs["p3"] and seq.num_computed_tokens == 16
    engine.scheduler.preempt(seq)
    while engine.has_unfinished():
        outputs["p3"] += engine.step()
    assert seq.num_preemptions == 1
    check(expected, outputs)


def test_requests_that_do_not_ask_get_no_extra_logits_rows(models, expected, monkeypatch):  # noqa: F811
    engine = make_engine(models, "ngram", 3, max_num_batched_tokens=8)
    rows = []
    logits_at = engine.runner.logits_at

    def counting(hidden, run_lengths, num_logits):
        rows.append(list(num_logits))
        return logits_at(hidden, run_lengths, num_logits)
    monkeypatch.setattr(engine.runner, "logits_at", counting)
    check(expected, run(engine, arrivals(ask=[])))
    assert all(count <= 1 + 3 for step in rows for count in step)
    assert sum(count for step in rows for count in step) == sum(
        len(expected[index][2]) for index in range(len(PROMPTS))) + engine.stats.draft_tokens - \
        engine.stats.accepted_tokens
