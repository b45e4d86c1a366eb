"""Sampled, with penalties on: speculative decoding keeps the target's distribution.

tests/test_spec_sampling.py's chi-square check (see its docstring), with the exact tuple
distribution computed by plain decoding *with the penalties applied to each prefix*
(repetition over prompt + output, frequency and presence over the output so far). The same
check fails when the engine drops the penalties, so the test can fail. (Forgetting only the
drafts ahead of a position changes the tuple distribution too little to detect at this
sample size: 3 sampled tokens seldom repeat. The greedy tests in tests/test_penalties.py
pin that case token by token.) (N-gram drafting is left out: penalties stop the tiny model from
repeating itself, so the n-gram drafter barely proposes; tests/test_penalties.py and
tests/test_logprobs.py cover it.)
"""

import pytest
import torch
from test_spec_sampling import (BLOCK_SIZE, K, MAX_TOKENS, NUM_SEEDS, SIGNIFICANCE, DEPTH, Setup,
                                chi_square_p_value)

from specwise.config import EngineConfig
from specwise.engine.llm_engine import LLMEngine
from specwise.engine.sampling import logits_processors
from specwise.engine.sampling.logits_processors import LogitsProcessing, Row
from specwise.engine.sampling.sampler import SamplingTensors, logits_to_probs
from specwise.engine.sequence import Sequence
from specwise.sampling_params import SamplingParams

PENALTIES = dict(temperature=1.0, repetition_penalty=1.6, frequency_penalty=2.0, presence_penalty=2.0)


class PenaltySetup(Setup):
    def next_probs(self, prefixes, params):
        if not params.processes_logits:
            return super().next_probs(prefixes, params)
        rows = []
        for start in range(0, len(prefixes), 256):
            chunk = prefixes[start:start + 256]
            blocks = -(-max(map(len, chunk)) // BLOCK_SIZE)
            tables = [list(range(row * blocks, (row + 1) * blocks)) for row in range(len(chunk))]
            logits = self.runner.forward(chunk, [0] * len(chunk), tables, num_logits=[1] * len(chunk))
            seqs = []
            for prefix in chunk:
                seq = Sequence("exact", self.prompt, params)
                seq.token_ids = list(prefix)                    # prompt + the tokens sampled so far
                seqs.append(seq)
            processed = LogitsProcessing([]).apply(logits, [Row(seq, []) for seq in seqs])
            rows.append(logits_to_probs(processed, SamplingTensors.from_params([params] * len(chunk), 1)).double())
        return torch.cat(rows)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    built = PenaltySetup(tmp_path_factory.mktemp("penalty_sampling"))
    built.exact["penalties"] = built.tuple_probs(SamplingParams(**PENALTIES))
    return built


def sample(setup, speculative: str | None) -> tuple[list[tuple], LLMEngine]:
    engine = LLMEngine(EngineConfig(dtype="float32", speculative=speculative, num_speculative_tokens=K,
                                    block_size=BLOCK_SIZE, num_kv_blocks=NUM_SEEDS * 12 + 16, max_model_len=128,
                                    max_num_batched_tokens=8192, max_num_seqs=NUM_SEEDS), setup.target)
    ids = [engine.add_request(setup.prompt, SamplingParams(**PENALTIES, seed=seed, max_tokens=MAX_TOKENS,
                                                           ignore_eos=True)) for seed in range(NUM_SEEDS)]
    finished = {}
    while engine.has_unfinished():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
    return [tuple(finished[rid].output_token_ids[:DEPTH]) for rid in ids], engine


@pytest.mark.parametrize("drafter", [None, "draft_near", "layer_skip"])
def test_sampling_with_penalties_has_the_target_distribution(setup, drafter):
    samples, engine = sample(setup, None if drafter is None else setup.speculative[drafter])
    if drafter is not None:
        assert engine.stats.drafts >= NUM_SEEDS // 2 and engine.stats.accepted_tokens > 0
    assert chi_square_p_value(samples, setup.exact["penalties"]) > SIGNIFICANCE


def test_speculation_without_the_penalties_fails_the_check(setup, monkeypatch):
    monkeypatch.setattr(logits_processors.LogitsProcessing, "apply", lambda self, logits, rows: logits)
    samples, _ = sample(setup, setup.speculative["draft_near"])
    assert chi_square_p_value(samples, setup.exact["penalties"]) < 1e-4
