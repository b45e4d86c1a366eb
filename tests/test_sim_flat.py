"""The flat-step simulator (sim/flat.py): every request accounted for, the KV cache never
over-subscribed, acceptance drawn per request (its own measured counters, or a measured
request of its category), and a step's time from the step-cost model."""

import json

import numpy as np
import pytest

from specwise.bench.inputs.request import WorkloadRequest
from specwise.bench.load.arrivals import LoadPoint
from specwise.bench.results import RequestRecord
from specwise.calc.arms import OFF, parse_arm
from specwise.calc.deployment import Deployment, DeploymentConfig
from specwise.calc.roofline import RooflineCost
from specwise.engine.cost.step_profile import ProfileCost
from specwise.sim.flat import FlatSimulator
from specwise.sim.request_acceptance import Draws, Replay, from_counts, from_record
from specwise.sim.simulator import SimServerConfig

DEPLOYMENT = Deployment.from_config(DeploymentConfig(model="llama-3.1-8b", gpu="h100-sxm"))
COST = RooflineCost(DEPLOYMENT)


def workload(count=60, seed=1) -> list[WorkloadRequest]:
    rng = np.random.default_rng(seed)
    return [WorkloadRequest(request_id=f"r{i}", category=("chat", "code")[i % 2], max_tokens=int(rng.integers(1, 120)),
                            prompt_tokens=int(rng.integers(10, 900))) for i in range(count)]


def constant_cost(seconds=0.01) -> ProfileCost:
    """Every step costs `seconds`, whatever its shape (prefill too)."""
    return ProfileCost([1, 2], [1, 2], [0, 1], np.full((2, 2, 2), seconds))


@pytest.mark.parametrize("load", [LoadPoint("concurrency", 1), LoadPoint("concurrency", 16), LoadPoint("rate", 50.0)],
                         ids=lambda p: p.label())
@pytest.mark.parametrize("kv_tokens", [200_000, 3_000], ids=["roomy", "tight"])
def test_every_request_ends_with_its_length_and_the_cache_holds(load, kv_tokens):
    requests = workload()
    for arm in (OFF, parse_arm("ngram:k=4,alpha=0.7", COST, DEPLOYMENT),
                parse_arm("lookahead:w=1,n=3,g=2,k=4,alpha=0.6", COST, DEPLOYMENT)):
        result = FlatSimulator(COST, SimServerConfig(max_num_batched_tokens=256), kv_tokens).run(requests, arm, load)
        assert [r.request_id for r in result.records] == [r.request_id for r in requests]
        for record, request in zip(result.records, requests):
            assert record.error is None and record.output_tokens == sum(record.chunk_tokens) == request.max_tokens
            assert record.chunk_times[0] == pytest.approx(record.ttft) and record.chunk_times[-1] == pytest.approx(
                record.e2e)
            assert np.all(np.diff(record.chunk_times) > 0)
        assert result.peak_kv_blocks <= result.kv_blocks
        if kv_tokens == 3_000 and load.value == 16:
            assert result.preemptions > 0


def test_own_acceptance_per_request():
    """A request that accepts everything emits 1 + 4 tokens a step; one that never drafts emits 1."""
    requests = [WorkloadRequest(request_id=name, category="chat", max_tokens=21, prompt_tokens=8) for name in "ab"]
    arm = parse_arm("ngram:k=4,alpha=0.5", COST, DEPLOYMENT)
    own = {"a": Draws(np.ones(4), 1.0), "b": Draws(np.ones(4), 0.0)}
    result = FlatSimulator(constant_cost(), SimServerConfig(), 10_000).run(requests, arm, LoadPoint("concurrency", 2),
                                                                           own=own)
    a, b = result.records
    assert a.chunk_tokens == [1, 5, 5, 5, 5] and a.accepted_per_position == [4, 4, 4, 4] and a.drafts == 4
    assert b.chunk_tokens == [1] * 21 and b.drafts == 0
    # 10 ms a step, a prefill included; b, sent with a, joins the second step (an idle engine starts on a alone)
    assert a.e2e == pytest.approx(0.05) and b.e2e == pytest.approx(0.22) and b.ttft == pytest.approx(0.02)


def test_measured_requests_keep_their_spread(tmp_path):
    """from=DIR: each simulated request takes one measured request's acceptance (all or nothing
    here), not the category's mean (one half)."""
    lines = [RequestRecord(arm="ngram-k4", method="ngram", load_kind="concurrency", load_value=1, category="chat",
                           request_id=f"m{i}", prompt_tokens=8, output_tokens=41, send_time=0.0, ttft=0.1, e2e=1.0,
                           drafts=10 if i else 40, draft_tokens=40 if i else 160, accepted_tokens=30 if i else 0,
                           accepted_per_position=[10, 10, 10, 0] if i else [0, 0, 0, 0]).to_json() for i in range(2)]
    (tmp_path / "requests.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "run.json").write_text(json.dumps({"tool": "evaluate"}))
    arm = parse_arm(f"ngram:k=4,from={tmp_path}", COST, DEPLOYMENT)
    requests = [WorkloadRequest(request_id=f"r{i}", category="chat", max_tokens=40, prompt_tokens=8) for i in range(40)]
    result = FlatSimulator(constant_cost(), SimServerConfig(), 100_000).run(requests, arm, LoadPoint("concurrency", 8))
    rates = [r.accepted_tokens / r.draft_tokens for r in result.records]
    # 3 of 4 a step, more where max_tokens leaves room for fewer drafts at the end
    assert {rate == 0 for rate in rates} == {True, False} and all(rate == 0 or rate >= 0.75 for rate in rates)


def test_from_counts():
    draws = from_counts(drafts=2, per_position=[2, 1, 0, 0], output_tokens=6, accepted=3, k=4, draft_tokens=6)
    assert draws.rates.tolist() == [1.0, 0.5, 0.0, 0.0] and draws.fraction == 1.0 and draws.length == 0.75
    assert from_counts(0, [], output_tokens=5, accepted=0, k=4).fraction == 0.0


def test_a_replay_places_the_measured_drafts_as_counted():
    """6 decode steps, 3 drafts of 9 tokens accepting 2, 1 and 0 (per-position [2, 1, 0, 0]): one
    draft of each length, at steps 1, 3 and 5 (not the last, which has no room), 3 tokens each."""
    replay = Replay.of(drafts=3, per_position=[2, 1, 0, 0], output_tokens=10, accepted=3, draft_tokens=9, k=4)
    assert replay.steps == 6 and [replay.draft(step) for step in range(1, 7)] == [(0, 3), None, (2, 3), None,
                                                                                (1, 3), None]
    # drafts at every step where the request drafted at each; 10 tokens over 3 drafts, the shortest
    # lengthened first: 4, 3, 3
    assert Replay.of(3, [1], output_tokens=5, accepted=1, draft_tokens=10, k=4).drafts == {
        1: (0, 4), 2: (1, 3), 3: (0, 3)}
    # a draft is as long as what it accepted: 7 of 15 accepted all 4, the 24 tokens left over the other 8
    replay = Replay.of(15, [13, 11, 9, 7], output_tokens=64, accepted=40, draft_tokens=52, k=4)
    assert sorted(replay.drafts.values()) == [(0, 3)] * 2 + [(1, 3)] * 2 + [(2, 3)] * 2 + [(3, 3)] * 2 + [(4, 4)] * 7


def test_a_replayed_request_runs_its_measured_drafts_and_steps():
    """`simulate --validate` replays each request's own counters: beside each other at concurrency 3,
    each simulated request drafts, accepts per position and steps exactly as measured."""
    measured = [RequestRecord(arm="ngram-k4", method="ngram", load_kind="concurrency", load_value=3, category="chat",
                              request_id=name, prompt_tokens=20, output_tokens=output, send_time=0.0, ttft=0.1, e2e=1.0,
                              drafts=drafts, draft_tokens=drafted, accepted_tokens=sum(positions),
                              accepted_per_position=positions)
                for name, output, drafts, drafted, positions in [("a", 64, 3, 12, [2, 1, 1, 0]),
                                                                 ("b", 64, 15, 52, [13, 11, 9, 7]),
                                                                 ("c", 40, 1, 4, [0, 0, 0, 0])]]
    requests = [WorkloadRequest(request_id=r.request_id, category="chat", max_tokens=r.output_tokens,
                                prompt_tokens=r.prompt_tokens) for r in measured]
    own = {r.request_id: from_record(r, 4, replay=True) for r in measured}
    arm = parse_arm("ngram:k=4,alpha=0.5", COST, DEPLOYMENT)
    result = FlatSimulator(constant_cost(), SimServerConfig(), 100_000).run(requests, arm, LoadPoint("concurrency", 3),
                                                                            own=own)
    for simulated, real in zip(result.records, measured):
        assert (simulated.drafts, simulated.draft_tokens, simulated.accepted_tokens, simulated.accepted_per_position) \
            == (real.drafts, real.draft_tokens, real.accepted_tokens, real.accepted_per_position)
        # one chunk for the prefill's token, then one a decode step
        assert len(simulated.chunk_tokens) == 1 + real.output_tokens - 1 - real.accepted_tokens


def test_short_drafts_keep_the_measured_acceptance_rate():
    """n-gram drafts half of k long on average, accepting 1 of them: the simulated rate is about
    1 / 2, not 1 / 4 (and never more drafts accepted than drafted)."""
    requests = [WorkloadRequest(request_id=f"r{i}", category="chat", max_tokens=200, prompt_tokens=8)
                for i in range(4)]
    arm = parse_arm("ngram:k=4,alpha=0.5", COST, DEPLOYMENT)
    own = {r.request_id: Draws(np.array([1.0, 0, 0, 0]), 1.0, length=0.5) for r in requests}
    result = FlatSimulator(constant_cost(), SimServerConfig(), 100_000).run(requests, arm,
                                                                            LoadPoint("concurrency", 4), own=own)
    drafted = sum(r.draft_tokens for r in result.records)
    assert sum(r.accepted_tokens for r in result.records) / drafted == pytest.approx(0.5, abs=0.02)


def test_a_request_sent_as_a_step_ends_misses_the_step_starting_then():
    """A busy engine starts its next step the instant the last one ends; the request a closed loop sends on
    that step's last token reaches the engine after, with no overhead too (flat.py `_reached`). 10 ms a step,
    concurrency 2 over a (2 tokens), b (10) and c (3): a's prompt alone (ends 10 ms), a's decode beside b's
    prompt (20 ms: a ends, c is sent), b's decode without c (30 ms), c's prompt beside b's decode (40 ms)."""
    requests = [WorkloadRequest(request_id=name, category="chat", max_tokens=tokens, prompt_tokens=8)
                for name, tokens in (("a", 2), ("b", 10), ("c", 3))]
    a, b, c = FlatSimulator(constant_cost(), SimServerConfig(), 10_000).run(
        requests, OFF, LoadPoint("concurrency", 2)).records
    assert a.chunk_times == pytest.approx([0.01, 0.02]) and b.chunk_times[:3] == pytest.approx([0.02, 0.03, 0.04])
    assert c.send_time == pytest.approx(0.02) and c.chunk_times == pytest.approx([0.02, 0.03, 0.04])


def test_a_mixed_step_pays_the_fixed_cost_once():
    """Decodes beside a prompt chunk: one forward. With every step 10 ms (fixed 10 ms), a decode
    step with a chunk beside it costs max(10, 10, 10 + 10 - 10) = 10 ms."""
    requests = [WorkloadRequest(request_id="a", category="chat", max_tokens=4, prompt_tokens=8, arrival_time=0.0),
                WorkloadRequest(request_id="b", category="chat", max_tokens=2, prompt_tokens=30, arrival_time=0.015)]
    result = FlatSimulator(constant_cost(), SimServerConfig(max_num_batched_tokens=16), 10_000).run(
        requests, OFF, LoadPoint("trace", 1.0))
    a, b = result.records
    # a: prefill ends at 10 ms, decodes at 20, 30, 40; b arrives at 15 ms: chunks of 15 and 15 in the
    # steps ending 30 and 40 ms (16 - 1 for a's decode), its first token at 40, its second at 50
    assert a.chunk_times == pytest.approx([0.01, 0.02, 0.03, 0.04])
    assert b.chunk_times == pytest.approx([0.025, 0.035])


def test_a_linear_model_costs_the_flat_step_as_it_is():
    """fixed 10 ms + 1 ms a row + 0.1 ms a KV token read: the prefill of 8 rows costs 18 ms; the
    decode steps verify 1 + 1 rows (max_tokens leaves room for 1 draft) over 8 cached tokens:
    10 + 2 + 0.8 = 12.8 ms. a accepts everything: 3 tokens, done at 30.8 ms."""
    from specwise.engine.cost.linear_cost import LinearStepCost
    request = WorkloadRequest(request_id="a", category="chat", max_tokens=3, prompt_tokens=8)
    arm = parse_arm("ngram:k=4,alpha=0.5", COST, DEPLOYMENT)
    result = FlatSimulator(LinearStepCost(0.010, 0.001, 0.0001), SimServerConfig(), 1000).run(
        [request], arm, LoadPoint("concurrency", 1), own={"a": Draws(np.ones(4), 1.0)})
    assert result.records[0].chunk_times == pytest.approx([0.018, 0.0308])
    assert result.records[0].chunk_tokens == [1, 2]


def test_a_prompt_chunk_after_its_cached_part_costs_its_attention_pairs():
    """10 ms a step + 10 us an attention pair (engine/cost/linear_cost.py: a sequence fed n rows over c cached
    tokens computes n c + n (n + 1) / 2), a token budget of 16. a (8-token prompt, 3 tokens): its
    prefill computes 36 pairs (10.36 ms), its decodes over 8 and 9 cached tokens 9 and 10. b (30-token
    prompt, 2 tokens) arrives at 15 ms and joins the third step beside a's decode: its first chunk of
    15 tokens over no cache computes 120 pairs (10 + 1.3 = 11.3 ms); its second chunk, 15 tokens after
    the first 15 are cached, 15 x 15 + 120 = 345 (13.45 ms), its decode over 30 cached tokens 31."""
    from specwise.engine.cost.linear_cost import LinearStepCost
    requests = [WorkloadRequest(request_id="a", category="chat", max_tokens=3, prompt_tokens=8, arrival_time=0.0),
                WorkloadRequest(request_id="b", category="chat", max_tokens=2, prompt_tokens=30, arrival_time=0.015)]
    cost = LinearStepCost(0.010, 0.0, 0.0, per_attention_pair_s=1e-5)
    a, b = FlatSimulator(cost, SimServerConfig(max_num_batched_tokens=16), 10_000).run(
        requests, OFF, LoadPoint("trace", 1.0)).records
    steps = np.cumsum([0.01036, 0.01009, 0.0113, 0.01345, 0.01031])
    assert a.chunk_times == pytest.approx(steps[:3])
    assert b.send_time + np.array(b.chunk_times) == pytest.approx(steps[3:])


def test_a_calibrated_servers_logits_rows_request_overhead_and_drafting_fit():
    """A server's fit (calibrate --endpoint): 10 ms + 1 ms a row + 0.1 ms a KV token + 2 ms a sampled
    row, 5 ms a request before it reaches the scheduler. off: admitted at 5 ms, its prefill of 8
    rows samples 1 (10 + 8 + 2 = 20 ms: first token at 25 ms), its decodes 13.8 and 13.9 ms. The ngram
    arm is costed with the speculating server's own fit (fixed 20 ms): prefill 30 ms (first token at
    35 ms), then 1 + 1 rows, both sampled, over 8 cached tokens: 20 + 2 + 0.8 + 4 = 26.8 ms."""
    from specwise.engine.cost.linear_cost import LinearStepCost
    ngram = LinearStepCost(0.020, 0.001, 0.0001, per_logits_row_s=0.002, request_overhead_s=0.005)
    cost = LinearStepCost(0.010, 0.001, 0.0001, per_logits_row_s=0.002, request_overhead_s=0.005,
                          drafting={"ngram": ngram})
    request = WorkloadRequest(request_id="a", category="chat", max_tokens=3, prompt_tokens=8)
    simulator = FlatSimulator(cost, SimServerConfig(), 1000)
    off = simulator.run([request], OFF, LoadPoint("concurrency", 1)).records[0]
    assert off.chunk_times == pytest.approx([0.025, 0.0388, 0.0527])
    arm = parse_arm("ngram:k=4,alpha=0.5", COST, DEPLOYMENT)
    spec = simulator.run([request], arm, LoadPoint("concurrency", 1), own={"a": Draws(np.ones(4), 1.0)}).records[0]
    assert spec.chunk_times == pytest.approx([0.035, 0.0618]) and spec.chunk_tokens == [1, 2]


def test_a_session_turn_waits_for_the_turn_before_it():
    """Concurrency 2 over [s-t0, s-t1, x]: the second worker holds s-t1 until s-t0 ends (at 30 ms:
    a 10 ms prefill and two 10 ms decodes), as evaluate's session replay does; then s-t1 goes out
    on that worker and x on s-t0's, at the same instant."""
    requests = [WorkloadRequest(request_id=rid, category="agentic", max_tokens=3, prompt_tokens=8)
                for rid in ("s-t0", "s-t1", "x")]
    result = FlatSimulator(constant_cost(), SimServerConfig(), 10_000).run(
        requests, OFF, LoadPoint("concurrency", 2), after={"s-t1": "s-t0"})
    sends = {r.request_id: r.send_time for r in result.records}
    assert sends == pytest.approx({"s-t0": 0.0, "s-t1": 0.03, "x": 0.03})
    free = FlatSimulator(constant_cost(), SimServerConfig(), 10_000).run(requests, OFF, LoadPoint("concurrency", 2))
    assert {r.request_id: r.send_time for r in free.records}["s-t1"] == 0.0


def test_a_turn_waits_for_a_turn_before_it_that_is_itself_held():
    """Concurrency 3 over [s-t0, s-t1, s-t2]: the second worker holds s-t1 on s-t0, the third s-t2 on
    s-t1, which a worker has taken but not sent (evaluate's session replay waits on a taken turn, sent
    or not). s-t0 ends at 30 ms, s-t1 goes out then and ends at 60 ms, s-t2 goes out then: not at 0."""
    requests = [WorkloadRequest(request_id=f"s-t{turn}", category="agentic", max_tokens=3, prompt_tokens=8)
                for turn in range(3)]
    result = FlatSimulator(constant_cost(), SimServerConfig(), 10_000).run(
        requests, OFF, LoadPoint("concurrency", 3), after={"s-t1": "s-t0", "s-t2": "s-t1"})
    sends = {r.request_id: r.send_time for r in result.records}
    assert sends == pytest.approx({"s-t0": 0.0, "s-t1": 0.03, "s-t2": 0.06})


def test_a_step_of_a_token_count_not_run_lately_pays_its_cost():
    """10 ms a step, 5 ms for a token count not among the last 2 the run's steps had (engine/cost/linear_cost.py
    RecentCounts). One request, 8-token prompt, 4 tokens: its prefill (count 8) pays, its first decode
    (count 1) pays, the next two do not: 15, 30, 40, 50 ms. Two requests sent together: an idle engine
    prefills the first alone (count 8, pays), then its decode beside the second's prompt of 9 (count 10,
    pays), 2-row decodes (count 2: pays once), the second's last decode alone (count 1, gone from the
    last 2: pays): a at 15, 30, 45, 55 ms, b at 30, 45, 55, 70."""
    from specwise.engine.cost.linear_cost import LinearStepCost
    cost = LinearStepCost(0.010, 0.0, 0.0, new_count_s=0.005, count_memory=2)
    one = WorkloadRequest(request_id="a", category="chat", max_tokens=4, prompt_tokens=8)
    record = FlatSimulator(cost, SimServerConfig(), 10_000).run([one], OFF, LoadPoint("concurrency", 1)).records[0]
    assert record.chunk_times == pytest.approx([0.015, 0.030, 0.040, 0.050])
    two = [one, WorkloadRequest(request_id="b", category="chat", max_tokens=4, prompt_tokens=9)]
    records = FlatSimulator(cost, SimServerConfig(), 10_000).run(two, OFF, LoadPoint("concurrency", 2)).records
    assert [r.chunk_times for r in records] == [pytest.approx([0.015, 0.030, 0.045, 0.055]),
                                                pytest.approx([0.030, 0.045, 0.055, 0.070])]
    plain = FlatSimulator(LinearStepCost(0.010, 0.0, 0.0), SimServerConfig(), 10_000).run(
        [one], OFF, LoadPoint("concurrency", 1)).records[0]
    assert plain.chunk_times == pytest.approx([0.010, 0.020, 0.030, 0.040])
