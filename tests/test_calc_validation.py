"""Direction and rough size of published results, reproduced on paper (figures printed with -s).

vLLM blog, "How Speculative Decoding Boosts vLLM Performance by up to 2.8x" (2024-10-17):
Llama-3-70B on 4xH100 with a 0.5B draft model (turboderp/Qwama-0.5B-Instruct) on ShareGPT,
up to 1.5x faster at QPS 1 and 1.4x slower at high QPS. Stand-ins here: qwen2.5-0.5b for
Qwama (the same Qwen2-0.5B body), k = 4, alpha = 0.7, 256-token prompts and outputs.
The pure roofline (no per-pass overheads) overstates the low-QPS gain; the direction holds.
"""

import numpy as np
import pytest

from specwise.bench.load.arrivals import LoadPoint
from specwise.bench.load.metrics import point_metrics
from specwise.bench.load.slo import SLO
from specwise.bench.inputs.traces import read_trace
from specwise.bench.inputs.request import WorkloadRequest
from specwise.calc.arms import OFF, parse_arm
from specwise.calc.deployment import Deployment, DeploymentConfig
from specwise.calc.roofline import RooflineCost
from specwise.sim.records import build_records
from specwise.sim.simulator import SimServerConfig, Simulator

AZURE_CONV = "azure-conv"                 # built-in trace, shipped in the package


def tpot_gain(deployment, arm, requests, qps) -> float:
    cost = RooflineCost(deployment)
    tpot = {}
    for which in (OFF, arm):
        capacity = deployment.memory_plan(which.drafter).kv_capacity_tokens
        result = Simulator(cost, SimServerConfig(), capacity).run(requests, which, LoadPoint("rate", qps))
        tpot[which.name] = point_metrics(build_records(result), SLO.from_dict({})).tpot.mean
    return tpot["off"] / tpot[arm.name]


def test_vllm_blog_llama3_70b_speedup_at_low_qps_slowdown_at_high_qps():
    deployment = Deployment.from_config(DeploymentConfig(model="llama-3-70b", gpu="h100-sxm", tp=4))
    arm = parse_arm("draft:k=4,alpha=0.7,drafter=qwen2.5-0.5b", RooflineCost(deployment), deployment)
    requests = [WorkloadRequest(request_id=str(i), category="sharegpt-like", max_tokens=256, prompt_tokens=256)
                for i in range(300)]
    low, high = tpot_gain(deployment, arm, requests, 1.0), tpot_gain(deployment, arm, requests, 32.0)
    print(f"\nvLLM-blog-like 70B/4xH100: TPOT gain {low:.2f}x at QPS 1, {high:.2f}x at QPS 32")
    assert low > 1.3
    assert high < 0.9


@pytest.mark.slow
def test_azure_conversation_hour_simulates_in_seconds():
    """The one-hour Azure conversation trace (19,366 requests), every request accounted for.
    Wall time is printed, not asserted."""
    import time

    requests = read_trace(AZURE_CONV)
    deployment = Deployment.from_config(DeploymentConfig(model="llama-3.1-8b", gpu="h100-sxm"))
    cost = RooflineCost(deployment)
    for arm in (OFF, parse_arm("draft:k=4,alpha=0.7,drafter=llama-3.2-1b", cost, deployment)):
        started = time.perf_counter()
        capacity = deployment.memory_plan(arm.drafter).kv_capacity_tokens
        result = Simulator(cost, SimServerConfig(), capacity).run(requests, arm, LoadPoint("trace", 1.0))
        simulated = time.perf_counter() - started
        records = build_records(result)
        total = time.perf_counter() - started
        print(f"\nAzure conv hour, {arm.name}: simulated in {simulated:.1f} s, records in {total - simulated:.1f} s "
              f"({result.decode_steps} decode steps, {result.prefill_steps} prefills)")
        assert len(records) == len(requests) == 19366
        assert all(r.error is None and sum(r.chunk_tokens) == r.output_tokens for r in records)
        assert result.duration > 3400
        assert np.isclose(result.occupancy, sum(r.e2e for r in records))
