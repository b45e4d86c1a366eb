"""The simulator follows what evaluate measures: steps where an n-gram drafter finds no match
(the share of steps that drafted, measured and simulated) and --duration's cut-off rule."""

import numpy as np
import pytest

from specwise.bench.load.arrivals import DRAIN_FACTOR, LoadPoint
from specwise.bench.results import RequestRecord
from specwise.bench.inputs.request import WorkloadRequest
from specwise.calc.acceptance import measured_acceptance
from specwise.calc.arms import OFF, parse_arm
from specwise.calc.deployment import Deployment, DeploymentConfig
from specwise.engine.cost.step_profile import ProfileCost
from specwise.sim.records import build_records
from specwise.sim.simulator import SimServerConfig, Simulator
from specwise.errors import ConfigError

DEPLOYMENT = Deployment.from_config(DeploymentConfig(model="smollm2-135m", gpu="h100-sxm"))
PLAIN_STEP, VERIFY_STEP = 0.1, 0.2


def flat_profile() -> ProfileCost:
    """Every step costs 0.1 s, except verifying 5 tokens per sequence: 0.2 s (prefill too, by length)."""
    seconds = [[[PLAIN_STEP, PLAIN_STEP], [VERIFY_STEP, VERIFY_STEP]] for _ in range(2)]
    return ProfileCost([1, 64], [1, 5], [0, 10_000], seconds)


COST = flat_profile()


def requests(count: int, max_tokens, arrivals=None) -> list[WorkloadRequest]:
    """max_tokens: one length, or a list cycled through."""
    lengths = max_tokens if isinstance(max_tokens, list) else [max_tokens]
    return [WorkloadRequest(request_id=f"r{i}", category="code", max_tokens=lengths[i % len(lengths)],
                            prompt_tokens=1, arrival_time=None if arrivals is None else arrivals[i])
            for i in range(count)]


def simulate(batch, arm, load, duration=None):
    return Simulator(COST, SimServerConfig(), 100_000).run(batch, arm, load, duration=duration)


def record(request_id, output_tokens, drafts, per_position) -> RequestRecord:
    return RequestRecord(arm="ngram-k2", method="ngram", load_kind="concurrency", load_value=1, category="code",
                         request_id=request_id, prompt_tokens=10, output_tokens=output_tokens, send_time=0.0,
                         ttft=0.1, e2e=1.0, drafts=drafts, draft_tokens=2 * drafts,
                         accepted_tokens=sum(per_position), accepted_per_position=per_position)


def test_measured_share_of_steps_that_drafted_counts_requests_that_never_drafted(tmp_path):
    # a: 21 tokens = 1 from prefill + 15 steps emitting 1 + 5 accepted; b: 11 tokens in 10 steps, no match ever
    rows = [record("a", 21, 5, [3, 2]), record("b", 11, 0, [])]
    (tmp_path / "requests.jsonl").write_text("".join(row.to_json() + "\n" for row in rows))
    acceptance = measured_acceptance(tmp_path, "ngram-k2")["*"]
    assert acceptance.positions == pytest.approx((0.6, 0.4))
    assert acceptance.draft_fraction == pytest.approx(5 / 25)
    assert "drafted=0.2" in acceptance.describe()


def test_drafted_key_sets_or_overrides_the_share(tmp_path):
    arm = parse_arm("ngram:k=4,alpha=0.7,drafted=0.3", COST, DEPLOYMENT)
    assert arm.acceptance["*"].draft_fraction == 0.3
    (tmp_path / "requests.jsonl").write_text(record("a", 21, 5, [3, 2]).to_json() + "\n")
    arm = parse_arm(f"ngram:k=2,from={tmp_path},drafted=0.9", COST, DEPLOYMENT)
    assert {value.draft_fraction for value in arm.acceptance.values()} == {0.9}
    for bad in ("0", "1.5"):
        with pytest.raises(ConfigError, match="share of steps"):
            parse_arm(f"ngram:k=4,alpha=0.7,drafted={bad}", COST, DEPLOYMENT)


def test_simulated_steps_draft_at_the_configured_share_and_cost_accordingly():
    arm = parse_arm("ngram:k=4,alpha=0.7,drafted=0.4", COST, DEPLOYMENT)
    records = build_records(simulate(requests(40, 200), arm, LoadPoint("concurrency", 1)))
    steps = sum(len(r.chunk_tokens) - 1 for r in records)                 # one chunk per decode step
    drafts = sum(r.drafts for r in records)
    assert drafts / steps == pytest.approx(0.4, abs=0.02)
    per_position = np.sum([r.accepted_per_position for r in records], axis=0) / drafts
    assert per_position == pytest.approx([0.7, 0.49, 0.343, 0.2401], abs=0.03)
    for r in records:
        # alone in the batch, a step that drafted costs a full verification, one that did not a plain step
        decode_steps = len(r.chunk_tokens) - 1
        assert r.e2e - r.ttft == pytest.approx(PLAIN_STEP * decode_steps + (VERIFY_STEP - PLAIN_STEP) * r.drafts)
        assert sum(r.chunk_tokens) == 200


def test_closed_loop_stops_sending_at_the_duration_and_cuts_off_late_finishers():
    # every step takes 0.1 s: 20 tokens take ~2 s, 50 tokens ~5 s. Four workers, duration 3 s:
    # r0-r3 go at 0; r0 and r2 end at ~2 s, so r4 (20 tokens) and r5 (50) go then; r4 ends at
    # ~4 s, when nothing more is sent; r5 would end after 6 s (2 x duration): cut off
    batch = requests(24, [20, 50])
    assert len(build_records(simulate(batch, OFF, LoadPoint("concurrency", 4)))) == 24
    result = simulate(batch, OFF, LoadPoint("concurrency", 4), duration=3.0)
    records = build_records(result)
    sent = ~np.isnan(result.state.send)
    assert np.all(result.state.send[sent] < 3.0)
    assert np.flatnonzero(sent).tolist() == [0, 1, 2, 3, 4, 5]
    assert [r.request_id for r in records] == ["r0", "r1", "r2", "r3", "r4"]
    assert all(r.send_time + r.e2e <= DRAIN_FACTOR * 3.0 for r in records)
    assert result.state.finish[5] > DRAIN_FACTOR * 3.0


def test_closed_loop_always_keeps_its_first_wave():
    result = simulate(requests(24, 20), OFF, LoadPoint("concurrency", 4), duration=0.05)
    records = build_records(result)
    assert len(records) == 4 and all(r.send_time == 0.0 for r in records)
    assert all(r.e2e > DRAIN_FACTOR * 0.05 for r in records)


def test_open_loop_drops_arrivals_after_the_duration_as_evaluate_does():
    arrivals = [0.5 * i for i in range(12)]
    batch = requests(12, [20, 20, 20, 20, 20, 40], arrivals)          # r5 arrives at 2.5 s, ends after 6.5 s
    bounded = build_records(simulate(batch, OFF, LoadPoint("trace", 1.0), duration=2.6))
    # the same run without the requests evaluate would never have sent
    alone = build_records(simulate(batch[:6], OFF, LoadPoint("trace", 1.0)))
    kept = [r for r in alone if r.send_time + r.e2e <= DRAIN_FACTOR * 2.6]
    assert [r.request_id for r in bounded] == [r.request_id for r in kept]
    assert [r.e2e for r in bounded] == pytest.approx([r.e2e for r in kept])
    assert len(kept) < len(alone)
