"""Roofline step costs, measured profiles, memory plan and the latency calculator, by hand."""

import json

import numpy as np
import pytest

from specwise.calc.catalog import GIB
from specwise.calc.deployment import Deployment, DeploymentConfig
from specwise.calc.latency import LatencyConfig, estimate_latency
from specwise.calc.roofline import RooflineCost
from specwise.engine.cost.step_profile import ProfileCost
from specwise.errors import ConfigError, InputError


def deployment(**settings) -> Deployment:
    settings = {"mem_efficiency": 1.0, "compute_efficiency": 1.0, **settings}
    return Deployment.from_config(DeploymentConfig(**settings))


def test_llama_8b_h100_decode_is_weights_over_bandwidth():
    cost = RooflineCost(deployment())
    weights = (8_030_261_248 - 128256 * 4096) * 2               # untied input embedding is gathered, not read
    kv = (1000 + 1) * 131072                                      # read 1,000 cached, write 1 new
    assert cost.step_time(1, 1, 1000) == pytest.approx((weights + kv) / 3.35e12)
    assert cost.step_time(1, 1, 1000) == pytest.approx(4.52e-3, abs=0.01e-3)
    assert cost.bound(1, 1, 1000) == "memory"


def test_llama_70b_on_four_h100_with_efficiency():
    cost = RooflineCost(deployment(model="llama-3.1-70b", tp=4, mem_efficiency=0.8, allreduce_latency_us=0))
    weights = (70_553_706_496 - 128256 * 8192) * 2
    memory = (weights + 327680 * 501) / (4 * 3.35e12 * 0.8)
    allreduce = 160 * (1 * 8192 * 2 * 2 * 3 / 4) / 450e9         # 2 per layer, ring, one NVLink direction
    assert cost.step_time(1, 1, 500) == pytest.approx(memory + allreduce)


def test_verification_is_nearly_free_when_memory_bound_and_linear_when_compute_bound():
    cost = RooflineCost(deployment())
    assert cost.step_time(1, 5, 500) / cost.step_time(1, 1, 500) < 1.01
    # 2,048 sequences over short contexts: 2 x 7.5e9 x 2,048 FLOPs outweigh 17.7 GB of reads
    big = cost.step_time(2048, 5, 10) / cost.step_time(2048, 1, 10)
    assert big == pytest.approx(5.0, rel=0.05)
    assert cost.bound(2048, 1, 10) == "compute"


def test_long_context_kv_reads_keep_large_batches_memory_bound():
    cost = RooflineCost(deployment())
    assert cost.bound(256, 5, 500) == "compute"
    assert cost.bound(256, 5, 32000) == "memory"
    # KV read does not grow with k: 5 tokens per sequence cost far less than 5x one
    assert cost.step_time(256, 5, 32000) / cost.step_time(256, 1, 32000) < 1.5


def test_prefill_is_compute_bound_and_counts_causal_attention():
    cost = RooflineCost(deployment())
    flops = 2 * cost.deployment.model.streamed_parameters * 2048 + cost.attention_flops_per_pair * 2048 * 2049 / 2
    assert cost.prefill_time([2048]) == pytest.approx(flops / 989.5e12)
    assert cost.prefill_time([1024, 1024]) < cost.prefill_time([2048])


def test_step_times_vectorised_and_step_time_forms_agree():
    cost = RooflineCost(deployment())
    many = cost.step_times(4, 2, np.array([0.0, 400.0, 4000.0]))
    assert many[1] == pytest.approx(cost.step_time(4, 2, [100, 100, 100, 100]))
    assert many[2] == pytest.approx(cost.step_time(4, 2, 1000))
    with pytest.raises(ConfigError):
        cost.step_time(2, 1, [1, 2, 3])


def test_fp8_weights_use_fp8_peak_and_half_the_bytes():
    bf16, fp8 = RooflineCost(deployment()), RooflineCost(deployment(weight_dtype="fp8", kv_dtype="fp8"))
    assert fp8.flops == 2 * bf16.flops
    assert fp8.weight_bytes == bf16.weight_bytes / 2
    assert fp8.kv_per_token == bf16.kv_per_token / 2
    assert RooflineCost(deployment(gpu="a100-80gb", weight_dtype="fp8")).flops == 312e12


def test_memory_plan():
    single = deployment(model="llama-3.1-70b").memory_plan()
    assert not single.fits and single.kv_capacity_tokens == 0
    plan = deployment(model="llama-3.1-8b", gpu_memory_utilization=0.9).memory_plan()
    free = 80 * GIB * 0.9 - 8_030_261_248 * 2
    assert plan.kv_capacity_tokens == int(free // 131072)
    drafter = deployment(model="llama-3.2-1b")
    assert plan.kv_capacity_tokens > deployment().memory_plan(drafter).kv_capacity_tokens


def test_config_validation():
    with pytest.raises(ConfigError):
        DeploymentConfig(weight_dtype="fp4")
    with pytest.raises(ConfigError):
        DeploymentConfig(tp=0)
    with pytest.raises(ConfigError):
        DeploymentConfig(mem_efficiency=1.5)
    assert DeploymentConfig(weight_dtype="bfloat16").weight_dtype == "bf16"


def test_latency_calculator_adds_up():
    d = deployment(mem_efficiency=0.8)
    cost = RooflineCost(d)
    result = estimate_latency(cost, d, LatencyConfig(prompt_tokens=1024, output_tokens=256, batch_size=2))
    assert result.ttft_s == pytest.approx(cost.prefill_time([1024, 1024]))
    steps = [cost.step_time(2, 1, 1024 + j) for j in range(255)]
    assert result.tpot_s == pytest.approx(np.mean(steps))
    assert result.e2e_s == pytest.approx(result.ttft_s + sum(steps))
    assert result.fits and result.kv_tokens_needed == 2 * 1280
    assert (result.prefill_bound, result.decode_bound) == ("compute", "memory")


def profile_grid() -> ProfileCost:
    batch, tokens, context = [1, 8], [1, 5], [0, 1000]
    # seconds = 0.01 + 0.001 b + 0.002 t + 1e-6 b c: linear in each axis, so interpolation is exact
    seconds = [[[0.01 + 0.001 * b + 0.002 * t + 1e-6 * b * c for c in context] for t in tokens] for b in batch]
    return ProfileCost(batch, tokens, context, seconds, machine="test box", model="toy")


def test_profile_interpolates_and_extrapolates_linearly():
    profile = profile_grid()
    exact = lambda b, t, c: 0.01 + 0.001 * b + 0.002 * t + 1e-6 * b * c    # noqa: E731
    assert profile.step_time(8, 5, 1000) == pytest.approx(exact(8, 5, 1000))
    assert profile.step_time(4, 3, 500) == pytest.approx(0.01 + 0.004 + 0.006 + 1e-6 * 4.5 * 500, rel=0.1)
    assert profile.step_time(1, 1, 2000) == pytest.approx(exact(1, 1, 2000))       # beyond the context grid
    assert profile.step_time(16, 1, 0) == pytest.approx(exact(16, 1, 0))          # beyond the batch grid
    assert profile.prefill_time([5, 5]) == pytest.approx(profile.step_time(2, 5, 0))


def test_profile_prefill_axis_reads_total_prompt_tokens():
    profile = ProfileCost(*axes_of(profile_grid()), profile_grid().seconds,
                          prefill={"prefill_tokens": [100, 300], "prefill_seconds": [1.0, 2.0], "prefill_prompt_len": 100})
    assert profile.prefill_time([100]) == pytest.approx(1.0)
    assert profile.prefill_time([100, 100]) == pytest.approx(1.5)         # two prompts: 200 tokens
    assert profile.prefill_time([250, 250]) == pytest.approx(2.0 + 200 / 200)    # extended linearly
    assert profile_grid().prefill_time([100, 100]) == pytest.approx(profile_grid().step_time(2, 100, 0))
    padded = ProfileCost(*axes_of(profile_grid()), profile_grid().seconds,
                         prefill={**profile.prefill, "prefill_pads_to_longest": True})
    assert padded.prefill_time([50, 150]) == pytest.approx(2.0)           # computes 2 x 150 tokens
    assert profile.prefill_time([50, 150]) == pytest.approx(1.5)          # 200 tokens
    with pytest.raises(InputError, match="prefill_tokens"):
        ProfileCost(*axes_of(profile_grid()), profile_grid().seconds,
                    prefill={"prefill_tokens": [300, 100], "prefill_seconds": [1.0, 2.0]})


def axes_of(profile):
    return [axis.tolist() for axis in profile.axes]


def test_profile_file_round_trip_and_errors(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile_grid().to_json()))
    loaded = ProfileCost.load(path)
    assert loaded.step_time(8, 1, 0) == profile_grid().step_time(8, 1, 0)
    assert "test box" in loaded.description
    data = profile_grid().to_json()
    data["seconds"] = data["seconds"][:1]
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="shape"):
        ProfileCost.load(path)
    path.write_text(json.dumps({"batch_sizes": [1]}))
    with pytest.raises(InputError, match="format"):
        ProfileCost.load(path)
    with pytest.raises(InputError):
        ProfileCost([2, 1], [1], [0], [[[0.1]], [[0.2]]])
