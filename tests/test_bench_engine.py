"""The in-process engine arms: one model load, arms one after another, counted like HTTP."""

import json
import time

import pytest

from specwise.bench.config import EvaluateConfig
from specwise.bench.evaluate import evaluate
from specwise.bench.results import read_records, read_run_info
from specwise.config import EngineConfig

torch = pytest.importorskip("torch")
from tiny_models import tiny_checkpoint  # noqa: E402  (after the torch check)

PROMPTS = [
    {"prompt": "abc abc abc abc abc abc abc abc", "category": "repeat", "max_tokens": 16},
    {"prompt": "the cat the cat the cat the cat", "category": "repeat", "max_tokens": 16},
    {"messages": [{"role": "user", "content": "hello there"}], "category": "chat", "max_tokens": 12},
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("engine")
    workload = directory / "prompts.jsonl"
    workload.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    config = EvaluateConfig(methods="off,ngram:1-3@3", workload=str(workload), concurrency="1,3",
                            num_requests=6, warmup=1, output=str(directory / "results"), progress=False)
    outcome = evaluate(config, EngineConfig(dtype="float32", max_model_len=256, num_kv_blocks=256), argv=[],
                       checkpoint=tiny_checkpoint())
    return outcome, read_records(outcome.results_dir)


def test_every_arm_gets_the_same_requests(run):
    outcome, records = run
    measured = [r for r in records if not r.warmup]
    by_arm = {arm: sorted((r.load_value, r.request_id) for r in measured if r.arm == arm)
              for arm in ("off", "ngram-1-3-k3")}
    assert len(by_arm["off"]) == 12 and by_arm["off"] == by_arm["ngram-1-3-k3"]
    assert sum(r.warmup for r in records) == 2
    assert all(r.error is None for r in records)
    assert read_run_info(outcome.results_dir)["baseline"] == "off"


def test_chunks_carry_the_tokens_of_each_step(run):
    _, records = run
    for record in records:
        assert sum(record.chunk_tokens) == record.output_tokens == len(record.chunk_times) + sum(
            n - 1 for n in record.chunk_tokens)
        assert record.prompt_tokens > 0 and record.ttft == record.chunk_times[0]


def test_acceptance_counters_only_on_the_speculative_arm(run):
    _, records = run
    assert all(r.drafts is None for r in records if r.arm == "off")
    spec = [r for r in records if r.arm == "ngram-1-3-k3"]
    assert all(r.drafts is not None and 0 <= r.accepted_tokens <= r.draft_tokens <= 3 * r.drafts for r in spec)
    assert sum(r.drafts for r in spec) > 0
    # every accepted draft token arrives in the same chunk as the step's own token
    for record in spec:
        assert sum(n - 1 for n in record.chunk_tokens) == record.accepted_tokens


def test_greedy_outputs_have_the_same_length_in_every_arm(run):
    _, records = run
    lengths = {}
    for record in records:
        lengths.setdefault((record.load_value, record.request_id, record.warmup), set()).add(record.output_tokens)
    assert all(len(values) == 1 for values in lengths.values())


def test_report_covers_both_arms(run):
    outcome, _ = run
    summary = json.loads(outcome.report.summary_json.read_text())
    rows = {(r["arm"], r["load_value"], r["category"]): r for r in summary["rows"]}
    assert rows[("ngram-1-3-k3", 1, "all")]["metrics"]["acceptance"]["source"] == "requests"
    assert rows[("off", 3, "repeat")]["metrics"]["completed"] == 4
    assert [v["arm"] for v in summary["recommendation"]["verdicts"]] == ["ngram-1-3-k3"]


def test_next_arm_waits_for_requests_cut_off_in_the_last_one(tmp_path, monkeypatch):
    """An engine stuck on the long request (it never ends on its own): the --duration cut-off aborts it,
    and the next arm's drafter switch waits until the engine has let it go.

    Only the long request stalls, so the quick one, warmed up first, is measured at the engine's own
    speed, well within --duration (at most 0.06 s measured with both cores loaded, against 1 s; cold,
    the first request took up to 0.37 s, which with 0.1 s sleeps per step overran a 0.5 s --duration
    and left the second arm without its cut-off); the long one is then sent and must be cut off, in
    every arm, whatever the machine's speed.
    """
    from specwise.engine.llm_engine import LLMEngine
    step = LLMEngine.step

    def stuck_on_the_long_request(engine):
        long = [seq for request_id, seq in engine.requests.items()
                if request_id.startswith("w:2-") and not seq.is_finished]
        if long and not engine.aborted:
            time.sleep(0.01)                # one step that produces nothing; the step thread polls again
            return []
        return step(engine)

    monkeypatch.setattr(LLMEngine, "step", stuck_on_the_long_request)
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"prompt": "abc abc", "max_tokens": 2}) + "\n"
                        + json.dumps({"prompt": "abc abc abc", "max_tokens": 30, "category": "long"}) + "\n")
    # concurrency 1: the quick request is the first wave (always measured), the long one the cut-off second;
    # the warm-up request is the quick one
    config = EvaluateConfig(methods="off,ngram:1-3@3", workload=str(workload), concurrency="1", num_requests=2,
                            duration=1.0, warmup=1, output=str(tmp_path / "out"), progress=False, order="file",
                            schedule="sequential")
    outcome = evaluate(config, EngineConfig(dtype="float32", max_model_len=256, num_kv_blocks=256, max_num_batched_tokens=256),
                       argv=[], checkpoint=tiny_checkpoint())
    records = [r for r in read_records(outcome.results_dir) if not r.warmup]
    assert sorted(r.arm for r in records) == ["ngram-1-3-k3", "off"]
    assert all(r.request_id == "w:1" and r.error is None for r in records)
    cut = read_run_info(outcome.results_dir)["cut_off"]
    assert [(entry["arm"], entry["requests"]) for entry in cut] == [("off", 1), ("ngram-1-3-k3", 1)]
