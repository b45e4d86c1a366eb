"""Penalties, min_tokens and logit_bias: what they do to logits, and that speculation keeps them exact.

  - the worked example of engine/sampling/logits_processors.py, row by row;
  - greedy outputs with repetition / frequency / presence penalties, logit_bias and min_tokens
    are token-identical with and without each drafter (ngram, a draft model, layer_skip),
    alone and in a continuous batch, and drafting happened;
  - min_tokens holds the end-of-sequence token back; logit_bias -100 bans a token.
"""

import pytest
import torch
from test_spec_exactness import ENGINE, PROMPTS, check_counters, make_engine, models, run  # noqa: F401

from specwise.config import EngineConfig
from specwise.engine.llm import LLM
from specwise.engine.llm_engine import LLMEngine
from specwise.engine.sampling.logits_processors import LogitsProcessing, Row
from specwise.engine.sequence import Sequence
from specwise.sampling_params import SamplingParams

PENALTIES = dict(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.3)
SETTINGS = {"penalties": PENALTIES, "repetition": dict(repetition_penalty=1.2),
            "bias_min_tokens": dict(logit_bias={32: 5.0, 101: -100.0}, min_tokens=15, frequency_penalty=-0.5)}


def greedy(max_tokens: int, **settings) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, **settings)


def drafting_engine(models, drafter: str, k: int = 3) -> LLMEngine:  # noqa: F811
    """Penalties make a greedy output repeat itself less: n-gram drafts from 1-token matches."""
    if drafter != "ngram":
        return make_engine(models, drafter, k)
    return LLMEngine(EngineConfig(speculative="ngram:1-3", num_speculative_tokens=k, **ENGINE), models[0])


def test_frequency_penalty_counts_the_drafts_before_each_row():
    seq = Sequence("r", [1, 2], SamplingParams(frequency_penalty=0.5))
    seq.token_ids += [7, 7]                              # output so far [7, 7]
    logits = torch.zeros(2, 10)
    out = LogitsProcessing([]).apply(logits, [Row(seq, []), Row(seq, [9])])
    assert out[0, 7] == -1.0 and out[0, 9] == 0.0 and out[0, 1] == 0.0       # prompt tokens are not output
    assert out[1, 7] == -1.0 and out[1, 9] == -0.5


def test_repetition_penalty_min_tokens_and_bias():
    seq = Sequence("r", [1, 2], SamplingParams(repetition_penalty=2.0, min_tokens=2, logit_bias={4: 1.5}))
    logits = torch.tensor([[0.0, 4.0, -4.0, 1.0, 0.0, 3.0]])
    out = LogitsProcessing([5]).apply(logits.repeat(3, 1), [Row(seq, []), Row(seq, [3]), Row(seq, [3, 0])])
    assert out[0].tolist() == [0.0, 2.0, -8.0, 1.0, 1.5, float("-inf")]      # 1 and 2 seen in the prompt
    assert out[1].tolist() == [0.0, 2.0, -8.0, 0.5, 1.5, float("-inf")]      # min_tokens: 1 token so far
    assert out[2][5] == 3.0 and out[2][3] == 0.5                              # 2 tokens: eos allowed


@pytest.fixture(scope="module")
def penalty_references(models):  # noqa: F811
    target, _ = models
    llm = LLM(checkpoint=target, **ENGINE)
    return {name: [llm.generate(text, greedy(max_tokens, **settings))[0].output_token_ids
                   for text, max_tokens in PROMPTS] for name, settings in SETTINGS.items()}


@pytest.mark.parametrize("drafter", ["ngram", "draft_same", "layer_skip", "lookahead"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_greedy_with_penalties_is_token_identical_under_speculation(models, penalty_references,  # noqa: F811
                                                                    drafter, setting):
    engine = drafting_engine(models, drafter)
    arrivals = [(index % 3, f"r{index}", text, greedy(max_tokens, **SETTINGS[setting]))
                for index, (text, max_tokens) in enumerate(PROMPTS)]
    outputs = run(engine, arrivals)
    for index in range(len(PROMPTS)):
        assert outputs[f"r{index}"][-1].output_token_ids == penalty_references[setting][index], index
    assert engine.stats.drafts > 0
    check_counters(engine, outputs)


def test_penalties_change_the_output(penalty_references, models):  # noqa: F811
    target, _ = models
    plain = LLM(checkpoint=target, **ENGINE).generate(PROMPTS[0][0], greedy(PROMPTS[0][1]))[0].output_token_ids
    assert plain != penalty_references["penalties"][0]
    assert 101 not in [t for output in penalty_references["bias_min_tokens"] for t in output]
