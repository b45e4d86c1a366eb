"""Simulator invariants: every request accounted for, no KV over-subscription, Little's law,
acceptance as configured, evaluate's load shapes, and evaluate's results format."""

import dataclasses
import json

import numpy as np
import pytest

from specwise.bench.load.arrivals import LoadPoint, gamma_arrivals
from specwise.bench.results import RequestRecord, read_records, read_run_info
from specwise.bench.report.summary import summarize
from specwise.bench.inputs.request import WorkloadRequest
from specwise.calc.arms import OFF, parse_arm
from specwise.calc.deployment import Deployment, DeploymentConfig
from specwise.calc.latency import LatencyConfig, estimate_latency
from specwise.calc.roofline import RooflineCost
from specwise.sim.cli import point_figures
from specwise.sim.records import build_records, write_results
from specwise.sim.state import SimState
from specwise.sim.workload import prompt_tokens
from specwise.sim.simulator import SimServerConfig, Simulator

DEPLOYMENT = Deployment.from_config(DeploymentConfig(model="llama-3.1-8b", gpu="h100-sxm"))
COST = RooflineCost(DEPLOYMENT)
CAPACITY = DEPLOYMENT.memory_plan().kv_capacity_tokens


def workload(count=120, seed=3, trace=False) -> list[WorkloadRequest]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(0.05, count)) if trace else [None] * count
    return [WorkloadRequest(request_id=f"r{i}", category=("chat", "code")[i % 2],
                            max_tokens=int(rng.integers(1, 300)), prompt_tokens=int(rng.integers(20, 3000)),
                            arrival_time=None if arrivals[i] is None else float(arrivals[i]))
            for i in range(count)]


def arms():
    return [OFF, parse_arm("ngram:k=4,alpha=0.6", COST, DEPLOYMENT),
            parse_arm("draft:policy=1=4/16=2/48=0,positions=0.9/0.7/0.5/0.3,drafter=llama-3.2-1b", COST, DEPLOYMENT)]


def simulate(requests, arm, load, capacity=CAPACITY, seed=0, **server):
    return Simulator(COST, SimServerConfig(**server), capacity, seed=seed).run(requests, arm, load)


LOADS = [LoadPoint("concurrency", 1), LoadPoint("concurrency", 32), LoadPoint("rate", 30.0),
         LoadPoint("trace", 2.0)]


@pytest.mark.parametrize("load", LOADS, ids=lambda p: p.label())
def test_conservation_and_littles_law(load):
    requests = workload(trace=True)
    for arm in arms():
        result = simulate(requests, arm, load)
        records = build_records(result)
        assert [r.request_id for r in records] == [r.request_id for r in requests]
        for record, request in zip(records, requests):
            assert record.error is None and record.output_tokens == request.max_tokens
            assert sum(record.chunk_tokens) == request.max_tokens
            assert record.chunk_times[0] == pytest.approx(record.ttft, abs=1e-6)
            assert record.chunk_times[-1] == pytest.approx(record.e2e, abs=1e-6)
            assert np.all(np.diff(record.chunk_times) >= 0) and 0 < record.ttft <= record.e2e
        # Little's law on the simulator's own clock: time-average in system = arrival rate x mean sojourn
        sojourn = sum(r.e2e for r in records)
        assert result.occupancy == pytest.approx(sojourn, rel=1e-9)
        mean_in_system = result.occupancy / result.duration
        assert mean_in_system == pytest.approx(len(records) / result.duration * sojourn / len(records))
        if load.kind == "concurrency":
            assert mean_in_system <= load.value + 1e-9
        assert result.peak_kv_blocks <= result.kv_blocks


def test_no_kv_oversubscription_under_pressure(monkeypatch):
    seen = []
    original = SimState._note_peak

    def audited(self, context_of, total, slots):
        seen.append(self._blocks(context_of(), slots))
        assert seen[-1] <= self.kv_blocks, "a step used more KV blocks than the cache holds"
        original(self, context_of, total, slots)

    monkeypatch.setattr(SimState, "_note_peak", audited)
    requests = workload(80)
    for arm in arms():
        result = simulate(requests, arm, LoadPoint("concurrency", 64), capacity=8000)
        records = build_records(result)
        assert result.preemptions > 0
        assert all(sum(r.chunk_tokens) == r.output_tokens for r in records)
        assert max(seen) <= result.kv_blocks == 500 and result.peak_kv_blocks <= 500


def test_request_too_long_for_the_cache_is_an_error_record():
    requests = workload(10)
    requests[3] = dataclasses.replace(requests[3], prompt_tokens=5000, max_tokens=10)
    records = build_records(simulate(requests, OFF, LoadPoint("concurrency", 4), capacity=4096))
    assert "KV" in records[3].error and records[3].output_tokens == 0
    assert all(r.error is None for i, r in enumerate(records) if i != 3)


def test_closed_loop_of_one_is_sequential_and_matches_the_latency_calculator():
    requests = [WorkloadRequest(request_id=str(i), category="x", max_tokens=64, prompt_tokens=512) for i in range(3)]
    records = build_records(simulate(requests, OFF, LoadPoint("concurrency", 1)))
    for before, after in zip(records, records[1:]):
        assert after.send_time == pytest.approx(before.send_time + before.e2e)
    expected = estimate_latency(COST, DEPLOYMENT, LatencyConfig(prompt_tokens=512, output_tokens=64))
    assert records[0].ttft == pytest.approx(expected.ttft_s)
    assert records[0].e2e == pytest.approx(expected.e2e_s)


def test_acceptance_matches_the_configured_rates():
    requests = [WorkloadRequest(request_id=str(i), category="x", max_tokens=400, prompt_tokens=100)
                for i in range(60)]
    arm = parse_arm("ngram:k=4,alpha=0.7", COST, DEPLOYMENT)
    records = build_records(simulate(requests, arm, LoadPoint("concurrency", 8)))
    drafts = sum(r.drafts for r in records)
    accepted = sum(r.accepted_tokens for r in records)
    assert sum(r.draft_tokens for r in records) == 4 * drafts
    assert accepted / (4 * drafts) == pytest.approx((0.7 + 0.49 + 0.343 + 0.2401) / 4, abs=0.02)
    per_position = np.sum([r.accepted_per_position for r in records], axis=0) / drafts
    assert per_position == pytest.approx([0.7, 0.49, 0.343, 0.2401], abs=0.025)


def test_batch_size_policy_turns_speculation_off_at_high_concurrency():
    requests = workload(96)
    arm = parse_arm("ngram:policy=1=4/24=0,alpha=0.7", COST, DEPLOYMENT)
    busy = build_records(simulate(requests, arm, LoadPoint("concurrency", 64)))
    calm = build_records(simulate(requests, arm, LoadPoint("concurrency", 2)))
    steps = lambda records: sum(len(r.chunk_tokens) for r in records)            # noqa: E731
    assert sum(r.drafts for r in busy) / steps(busy) < 0.5 * sum(r.drafts for r in calm) / steps(calm)


def test_same_seed_same_run_and_evaluate_arrival_times():
    requests = workload(40)
    arm = parse_arm("ngram:k=3,alpha=0.6", COST, DEPLOYMENT)
    first = build_records(simulate(requests, arm, LoadPoint("rate", 5.0), seed=7))
    again = build_records(simulate(requests, arm, LoadPoint("rate", 5.0), seed=7))
    other = build_records(simulate(requests, arm, LoadPoint("rate", 5.0), seed=8))
    assert [r.chunk_tokens for r in first] == [r.chunk_tokens for r in again]
    assert [r.chunk_tokens for r in first] != [r.chunk_tokens for r in other]
    assert [r.send_time for r in first] == pytest.approx(gamma_arrivals(40, 5.0, 1.0, 7))


def test_trace_time_scale_divides_arrival_times():
    requests = [WorkloadRequest(request_id=str(i), category="trace", max_tokens=5, prompt_tokens=10,
                                arrival_time=float(i)) for i in range(4)]
    records = build_records(simulate(requests, OFF, LoadPoint("trace", 2.0)))
    assert [r.send_time for r in records] == pytest.approx([0.0, 0.5, 1.0, 1.5])


def test_prompt_length_estimated_from_text():
    assert prompt_tokens(WorkloadRequest(request_id="a", category="c", prompt="x" * 400)) == (100, True)
    chat = WorkloadRequest(request_id="b", category="c", messages=[{"role": "user", "content": "y" * 40}])
    assert prompt_tokens(chat) == (10, True)
    assert prompt_tokens(WorkloadRequest(request_id="c", category="c", prompt_tokens=7)) == (7, False)


def test_results_directory_is_evaluate_format(tmp_path):
    requests = workload(30)
    results = [simulate(requests, arm, load) for load in LOADS[:2] for arm in arms()[:2]]
    info = {"model": "llama-3.1-8b", "machine": "simulated", "arms": [a.describe() for a in arms()[:2]],
            "baseline": "off", "loads": [dataclasses.asdict(p) for p in LOADS[:2]], "slo": {}}
    write_results(tmp_path, results, info)
    records = read_records(tmp_path)
    assert read_run_info(tmp_path)["tool"] == "simulate"
    assert len(records) == 4 * 30 and {r.arm for r in records} == {"off", "ngram-k4"}
    summary = summarize(records, read_run_info(tmp_path))
    row = summary.row("ngram-k4", "concurrency", 1)
    assert row.speedup["tpot_mean"] > 1.5 and row.metrics.acceptance.rate == pytest.approx(0.38, abs=0.05)
    # simulate's own compact table uses evaluate's definitions
    for (arm, kind, value), figures in point_figures(records).items():
        metrics = summary.row(arm, kind, value).metrics
        assert figures["tpot"] == pytest.approx(metrics.tpot.mean)
        assert figures["ttft"] == pytest.approx(metrics.ttft.mean)
        assert figures["e2e_p50"] == pytest.approx(metrics.e2e.p50)
        assert figures["throughput"] == pytest.approx(metrics.output_throughput)
        if arm != "off":
            assert figures["acceptance"] == pytest.approx(metrics.acceptance.rate)


def test_acceptance_from_an_evaluate_result(tmp_path):
    def record(category, drafts, per_position):
        return RequestRecord(arm="draft-k3", method="draft", load_kind="concurrency", load_value=1,
                             category=category, request_id=category, prompt_tokens=10, output_tokens=20,
                             send_time=0.0, ttft=0.1, e2e=1.0, drafts=drafts, draft_tokens=3 * drafts,
                             accepted_tokens=sum(per_position), accepted_per_position=per_position)
    (tmp_path / "requests.jsonl").write_text(
        record("chat", 10, [8, 6, 3]).to_json() + "\n" + record("code", 10, [10, 9, 8]).to_json() + "\n")
    arm = parse_arm(f"draft:k=3,from={tmp_path},drafter=llama-3.2-1b", COST, DEPLOYMENT)
    assert arm.acceptance["chat"].positions == pytest.approx((0.8, 0.6, 0.3))
    assert arm.acceptance["*"].positions == pytest.approx((0.9, 0.75, 0.55))
    assert arm.acceptance_for("other") is arm.acceptance["*"]


def test_acceptance_from_server_counters_of_an_endpoint_arm(tmp_path):
    record = RequestRecord(arm="vllm-eagle", method="eagle", load_kind="rate", load_value=1.0, category="chat",
                           request_id="a", prompt_tokens=10, output_tokens=20, send_time=0.0, ttft=0.1, e2e=1.0)
    (tmp_path / "requests.jsonl").write_text(record.to_json() + "\n")
    server = [{"arm": "vllm-eagle", "source": "vllm", "drafts": 100.0, "accepted_per_position": [70.0, 40.0]},
              {"arm": "vllm-eagle", "source": "vllm", "drafts": 100.0, "accepted_per_position": [50.0, 20.0]},
              {"arm": "other", "source": "vllm", "drafts": 10.0, "accepted_per_position": [1.0, 1.0]}]
    (tmp_path / "run.json").write_text(json.dumps({"tool": "evaluate", "server_acceptance": server}))
    arm = parse_arm(f"eagle:from={tmp_path},arm=vllm-eagle,cost=0.05", COST, DEPLOYMENT)
    assert arm.name == "eagle-k2" and arm.acceptance["*"].positions == pytest.approx((0.6, 0.3))
