"""Logprobs are the target's, and speculation does not change them.

  - greedy, for each drafter: the tokens and, per token, the logprob and the top-5 list equal
    those of plain decoding (to float tolerance: a verification forward batches positions
    differently), with penalties on too;
  - the values are log_softmax of the processed logits before temperature: a request at
    temperature 0.5 gets the same logprobs for the same tokens as one at temperature 1.
"""

import math

import pytest
from test_penalties import drafting_engine
from test_spec_exactness import ENGINE, PROMPTS, models, run  # noqa: F401

from specwise.config import EngineConfig
from specwise.engine.llm_engine import LLMEngine
from specwise.sampling_params import SamplingParams

TOLERANCE = 1e-4


def logprob_run(engine: LLMEngine, **settings) -> dict:
    arrivals = [(index % 2, f"r{index}", text, SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=5,
                                                              **settings))
                for index, (text, max_tokens) in enumerate(PROMPTS)]
    outputs = run(engine, arrivals)
    return {request_id: (steps[-1].output_token_ids, [lp for step in steps for lp in step.new_logprobs])
            for request_id, steps in outputs.items()}


def assert_same(expected: dict, actual: dict) -> None:
    for request_id, (tokens, logprobs) in expected.items():
        got_tokens, got_logprobs = actual[request_id]
        assert got_tokens == tokens, request_id
        assert len(got_logprobs) == len(tokens) == len(logprobs)
        for mine, theirs in zip(got_logprobs, logprobs):
            assert mine.token_id == theirs.token_id
            assert mine.logprob == pytest.approx(theirs.logprob, abs=TOLERANCE)
            assert [t for t, _ in mine.top][:3] == [t for t, _ in theirs.top][:3]
            assert [v for _, v in mine.top] == pytest.approx([v for _, v in theirs.top], abs=TOLERANCE)


@pytest.fixture(scope="module")
def plain(models):  # noqa: F811
    engine = LLMEngine(EngineConfig(**ENGINE), models[0])
    return {"none": logprob_run(engine), "penalties": logprob_run(engine, frequency_penalty=0.5,
                                                                  repetition_penalty=1.1)}


@pytest.mark.parametrize("drafter", ["ngram", "draft_same", "layer_skip", "lookahead"])
@pytest.mark.parametrize("setting", ["none", "penalties"])
def test_logprobs_with_speculation_equal_logprobs_without(models, plain, drafter, setting):  # noqa: F811
    engine = drafting_engine(models, drafter)
    settings = {} if setting == "none" else dict(frequency_penalty=0.5, repetition_penalty=1.1)
    assert_same(plain[setting], logprob_run(engine, **settings))
    assert engine.stats.accepted_tokens > 0


def test_logprobs_are_a_distribution_before_temperature(models, plain):  # noqa: F811
    tokens, logprobs = plain["none"]["r0"]
    for item in logprobs:
        assert item.top[0][1] >= item.logprob and item.logprob <= 0
        assert sum(math.exp(v) for _, v in item.top) <= 1 + 1e-5
    engine = LLMEngine(EngineConfig(**ENGINE), models[0])
    text, max_tokens = PROMPTS[0]
    engine.add_request(text, SamplingParams(temperature=0.5, top_k=3, seed=1, max_tokens=max_tokens, logprobs=1))
    steps = []
    while engine.has_unfinished():
        steps += engine.step()
    sampled = [lp for step in steps for lp in step.new_logprobs]
    prefix = 0
    while prefix < len(tokens) and steps[-1].output_token_ids[prefix] == tokens[prefix]:
        prefix += 1
    for mine, theirs in zip(sampled[:prefix], logprobs[:prefix]):     # same context: same logprob
        assert mine.logprob == pytest.approx(theirs.logprob, abs=TOLERANCE)
