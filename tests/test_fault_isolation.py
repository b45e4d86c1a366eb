"""Fault isolation (engine/fault_isolation.py): a fault in one request's work, injected at each seam of the
step, fails that request alone; the six others' greedy outputs equal a clean run's without it (fp32)."""

import math

import pytest
import torch

from conftest import TINY_ENGINE
from specwise.engine.fault_isolation import EngineDead, FailedSteps, RequestFault, isolate
from specwise.engine.llm import LLM
from specwise.engine.scheduler import ScheduledBatch
from specwise.sampling_params import SamplingParams, StructuredOutput
from tiny_models import tiny_checkpoint

PROMPTS = ["abcabcabcabc", "Hello, world. Hello, world.", "the cat the cat the", "0101010101",
           "xyz xyz xyz", "def f(x): return f(x)", "aaaa bbbb aaaa bbbb"]
BAD = 3                                  # the request whose work raises, fourth of seven in the batch
MAX_TOKENS = 24
FAULT_AFTER = 3                          # the bad request's work raises once it has this many output tokens


def params(**overrides) -> SamplingParams:
    return SamplingParams(**{"temperature": 0, "max_tokens": MAX_TOKENS, "ignore_eos": True, **overrides})


@pytest.fixture(scope="module")
def module_llm():
    return LLM(checkpoint=tiny_checkpoint(), **{**TINY_ENGINE, "speculative": "ngram"})


@pytest.fixture
def engine(module_llm):
    engine = module_llm.engine
    yield engine
    for request_id in list(engine.requests):
        engine.abort(request_id)
    while engine.has_unfinished():
        engine.step()
    engine.failed_steps = FailedSteps()
    engine.block_manager.check_invariants()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def run(engine, requests: dict[str, tuple[str, SamplingParams]], before_step=None) -> dict:
    for request_id, (prompt, sampling) in requests.items():
        engine.add_request(prompt, sampling, request_id)
    finished = {}
    while engine.has_unfinished():
        if before_step is not None:
            before_step()
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
    return finished


@pytest.fixture(scope="module")
def clean(module_llm):
    """The six good requests' outputs, run without the bad one (n-gram drafts were verified)."""
    outputs = run(module_llm.engine, {f"r{i}": (prompt, params()) for i, prompt in enumerate(PROMPTS) if i != BAD})
    assert sum(output.spec.drafts for output in outputs.values()) > 0
    return outputs


def bad_seq(engine):
    return engine.requests["bad"]


def raising(original, when, calls: list):
    """original, except that it raises (and counts) whenever when(*args) holds."""
    def wrapped(*args, **kwargs):
        if when(*args):
            calls.append(1)
            raise RuntimeError("injected fault")
        return original(*args, **kwargs)
    return wrapped


def late(seq) -> bool:
    return seq.request_id == "bad" and seq.num_output_tokens >= FAULT_AFTER


def inject_proposer(engine, monkeypatch, calls):
    monkeypatch.setattr(engine.proposer, "propose",
                        raising(engine.proposer.propose, lambda seqs, k: any(late(seq) for seq in seqs), calls))


def inject_grammar(method):
    def inject(engine, monkeypatch, calls):
        matcher = engine.runner.processing.matchers[bad_seq(engine).seq_id]
        seq = bad_seq(engine)
        monkeypatch.setattr(matcher, method, raising(getattr(matcher, method), lambda *args: late(seq), calls))
    return inject


def inject_logits_processing(engine, monkeypatch, calls):
    processing = engine.runner.processing
    monkeypatch.setattr(processing, "_apply_seq",
                        raising(processing._apply_seq, lambda logits, seq, drafts: late(seq), calls))


def inject_nan(engine, monkeypatch, calls):
    processing, original = engine.runner.processing, engine.runner.processing._apply_seq

    def apply_seq(logits, seq, drafts):
        if late(seq):
            calls.append(1)
            return torch.full_like(logits, float("nan"))
        return original(logits, seq, drafts)
    monkeypatch.setattr(processing, "_apply_seq", apply_seq)


def inject_sampler(engine, monkeypatch, calls):
    runner = engine.runner
    monkeypatch.setattr(runner, "distribution",
                        raising(runner.distribution, lambda logits, seqs: any(late(seq) for seq in seqs), calls))


def inject_detokenizer(engine, monkeypatch, calls):
    outputs = engine.outputs
    monkeypatch.setattr(outputs, "append", raising(outputs.append, lambda seq, emitted: late(seq), calls))


REGEX = StructuredOutput("regex", r"[a-z ]{1,60}")
# seam -> (how to inject, the bad request's settings, what its error names)
SEAMS = {
    "proposer": (inject_proposer, params(), "injected fault"),
    "grammar-drafts": (inject_grammar("valid_prefix"), params(structured_output=REGEX), "injected fault"),
    "grammar-mask": (inject_grammar("masks"), params(structured_output=REGEX), "logits processing"),
    "grammar-accept": (inject_grammar("accept"), params(structured_output=REGEX), "injected fault"),
    "logits-processing": (inject_logits_processing, params(repetition_penalty=1.3), "logits processing"),
    "nan-row": (inject_nan, params(repetition_penalty=1.3), "no finite maximum"),
    "sampler": (inject_sampler, params(temperature=0.9, seed=7), "injected fault"),
    "detokenizer": (inject_detokenizer, params(), "injected fault"),
}


@pytest.mark.parametrize("seam", list(SEAMS))
def test_only_the_faulty_request_fails_and_the_others_equal_a_clean_run(engine, clean, monkeypatch, seam, caplog):
    inject, bad_params, reason = SEAMS[seam]
    requests = {("bad" if i == BAD else f"r{i}"): (prompt, bad_params if i == BAD else params())
                for i, prompt in enumerate(PROMPTS)}
    calls, injected = [], []

    def before_step():
        if not injected and "bad" in engine.requests:
            inject(engine, monkeypatch, calls)
            injected.append(1)

    outputs = run(engine, requests, before_step)
    bad = outputs.pop("bad")
    assert bad.finish_reason == "error" and reason in bad.error
    assert len(bad.output_token_ids) >= FAULT_AFTER
    # retried alone once after failing in its batch, then never again: at most 1 + log2(batch) attempts
    assert 1 <= len(calls) <= 1 + math.ceil(math.log2(len(PROMPTS)))
    assert {request_id: (o.output_token_ids, o.finish_reason) for request_id, o in outputs.items()} == \
        {request_id: (o.output_token_ids, o.finish_reason) for request_id, o in clean.items()}
    assert any("request bad failed" in record.getMessage() for record in caplog.records)
    monkeypatch.undo()
    again = run(engine, {"after": (PROMPTS[0], params())})["after"]          # the engine carries on
    assert again.output_token_ids == clean["r0"].output_token_ids


def test_a_fault_in_every_request_of_a_step_kills_the_engine(engine, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the model is broken")
    monkeypatch.setattr(engine.runner, "execute", broken)
    engine.add_request(PROMPTS[0], params(), "a")
    engine.add_request(PROMPTS[1], params(), "b")
    with pytest.raises(EngineDead, match="every request of the step failed.*the model is broken"):
        engine.step()


def test_one_request_at_a_time_failing_kills_the_engine_on_the_third_step(engine, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the model is broken")
    monkeypatch.setattr(engine.runner, "execute", broken)
    for attempt in range(2):
        outputs = run(engine, {f"alone{attempt}": (PROMPTS[0], params())})
        assert outputs[f"alone{attempt}"].finish_reason == "error"
    engine.add_request(PROMPTS[0], params(), "third")
    with pytest.raises(EngineDead, match="3 step"):
        engine.step()


def test_isolate_bisects_to_the_raising_rows_and_takes_named_faults_at_their_word():
    class Seq:
        pass
    seqs = [Seq() for _ in range(7)]
    batch = ScheduledBatch(seqs, [1] * 7)
    attempts = []

    def compute(sub):
        attempts.append(len(sub.seqs))
        if seqs[5] in sub.seqs:
            raise ValueError("row 5")
        if seqs[1] in sub.seqs:
            raise RequestFault([seqs[1]], "row 1")
        return [seqs.index(seq) * 10 for seq in sub.seqs]

    results, faults = isolate(batch, compute)
    assert sorted(faults) == [1, 5] and str(faults[5]) == "row 5" and str(faults[1]) == "row 1"
    assert results == {row: row * 10 for row in (0, 2, 3, 4, 6)}
    assert attempts == [7, 3, 4, 2, 2, 2, 1, 1]      # [0..6], [0..2], [3..6], [0, 2], [3, 4], [5, 6], [5], [6]


@pytest.mark.parametrize("speculative", ["suffix", "lookahead"])
def test_a_stateful_drafter_raising_for_one_request_leaves_the_others_exact(speculative, monkeypatch):
    """Drafters that keep state per request (suffix indexes, lookahead's window and draft trees) are
    retried after the fault like any other work; the others' outputs still equal a clean run's."""
    engine = LLM(checkpoint=tiny_checkpoint(), **{**TINY_ENGINE, "speculative": speculative}).engine
    clean_outputs = run(engine, {f"r{i}": (prompt, params()) for i, prompt in enumerate(PROMPTS) if i != BAD})
    assert sum(output.spec.drafts for output in clean_outputs.values()) > 0
    calls, injected = [], []

    def before_step():
        if not injected and "bad" in engine.requests:
            inject_proposer(engine, monkeypatch, calls)
            injected.append(1)

    outputs = run(engine, {("bad" if i == BAD else f"r{i}"): (prompt, params()) for i, prompt in enumerate(PROMPTS)},
                  before_step)
    assert outputs.pop("bad").finish_reason == "error" and calls
    assert {key: o.output_token_ids for key, o in outputs.items()} == \
        {key: o.output_token_ids for key, o in clean_outputs.items()}
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
