"""lookahead everywhere the other drafters are: evaluate arms, serve, the auto policy, the
calculators and simulator, estimate, and the recommendation (TensorRT-LLM's config; vLLM and
SGLang have none)."""

import argparse
import json

import openai
import pytest

from specwise.bench.config import EvaluateConfig
from specwise.bench.evaluate import evaluate
from specwise.bench.load.arms import infer_method, parse_methods
from specwise.bench.results import read_records
from specwise.bench.report.server_configs import sglang_flags, trtllm_config, vllm_config
from specwise.calc import cli as calc_cli
from specwise.calc.arms import parse_arm
from specwise.calc.catalog import get_gpu, get_model
from specwise.calc.deployment import Deployment
from specwise.calc.roofline import RooflineCost
from specwise.cli import main
from specwise.config import EngineConfig
from specwise.engine.llm_engine import LLMEngine
from specwise.engine.spec_decode.config import SpeculativeConfig
from specwise.errors import ConfigError
from specwise.sampling_params import SamplingParams
from test_server_harness import TINY_ENGINE, serve
from tiny_models import tiny_checkpoint


def test_evaluate_arms_keep_lookaheads_commas():
    arms = parse_methods("off,ngram,lookahead:2,3,2,lookahead:1,4,2@6", 4)
    assert [(arm.name, arm.spec, arm.k) for arm in arms] == [
        ("off", None, 0), ("ngram-k4", "ngram", 4), ("lookahead-w2n3g2-k4", "lookahead:2,3,2", 4),
        ("lookahead-w1n4g2-k6", "lookahead:1,4,2", 6)]
    assert parse_methods("lookahead", 4)[0].spec == SpeculativeConfig.parse("lookahead", 4).label
    assert infer_method("trtllm-lookahead") == "lookahead"


def test_evaluate_runs_a_lookahead_arm_in_process(tmp_path):
    workload = tmp_path / "prompts.jsonl"
    workload.write_text("".join(json.dumps(p) + "\n" for p in [
        {"prompt": "abc abc abc abc abc abc abc abc", "category": "repeat", "max_tokens": 16},
        {"prompt": "the cat the cat the cat", "category": "repeat", "max_tokens": 12}]))
    config = EvaluateConfig(methods="off,lookahead:2,3,2@3", workload=str(workload), concurrency="1", num_requests=2,
                            warmup=0, output=str(tmp_path / "results"), progress=False)
    outcome = evaluate(config, EngineConfig(dtype="float32", max_model_len=256, num_kv_blocks=256), argv=[],
                       checkpoint=tiny_checkpoint())
    records = read_records(outcome.results_dir)
    lookahead = [r for r in records if r.arm == "lookahead-w2n3g2-k3"]
    off = {r.request_id: r.output_tokens for r in records if r.arm == "off"}
    assert len(lookahead) == 2 and all(r.error is None for r in records)
    assert {r.request_id: r.output_tokens for r in lookahead} == off
    assert sum(r.drafts for r in lookahead) > 0 and all(r.draft_tokens <= 3 * r.drafts for r in lookahead)


def test_serve_with_lookahead_answers_as_the_target_alone():
    reference = LLMEngine(EngineConfig(**{**TINY_ENGINE, "speculative": None}), tiny_checkpoint())
    reference.add_request("abcabcabcabc", SamplingParams(temperature=0, max_tokens=20))
    expected = None
    while reference.has_unfinished():
        for output in reference.step():
            expected = output.text if output.finished else expected
    engine = LLMEngine(EngineConfig(**{**TINY_ENGINE, "speculative": "lookahead:2,3,2"}), tiny_checkpoint())
    with serve(engine) as running:
        client = openai.OpenAI(base_url=running.url("/v1"), api_key="unused", max_retries=0, timeout=60)
        response = client.completions.create(model="tiny", prompt="abcabcabcabc", max_tokens=20, temperature=0)
    assert response.choices[0].text == expected
    assert engine.stats.drafts > 0


def test_auto_policy_chooses_between_off_and_the_full_tree():
    engine = LLMEngine(EngineConfig(dtype="float32", max_model_len=128, num_kv_blocks=128, max_num_seqs=4,
                                    speculative="lookahead:2,3,2", speculative_policy="auto"), tiny_checkpoint())
    assert engine.num_speculative_tokens == 10                  # (2 + 2)(3 - 1) + (4 - 2) rows at k 4
    assert engine.policy.levels == [(0, 0), (10, 4)]
    assert engine.policy.choose_k(1, 50) in (0, 10)


def test_recommendation_gives_tensorrt_llms_config_and_says_vllm_and_sglang_lack_it():
    assert vllm_config("lookahead:4,3,4", "lookahead", 2, [])["vllm"] is None
    assert "vLLM and SGLang have no lookahead" in vllm_config("lookahead:4,3,4", "lookahead", 2, [])["vllm_note"]
    assert sglang_flags("lookahead:4,3,4", "lookahead", 2)["sglang"] is None
    config = trtllm_config("lookahead:5,4,3", "lookahead")
    assert config["trtllm"] == ("speculative_config=LookaheadDecodingConfig(max_window_size=5, max_ngram_size=4, "
                                "max_verification_set_size=3)")
    assert "decoding_type: Lookahead" in config["trtllm_yaml"]
    assert trtllm_config("ngram", "ngram") == {"trtllm": None}


@pytest.fixture(scope="module")
def roofline():
    deployment = Deployment(get_model("llama-3.1-8b"), get_gpu("h100-sxm"))
    return RooflineCost(deployment), deployment


def test_a_calculator_arm_verifies_its_longest_candidate_and_pays_for_every_row(roofline):
    cost, deployment = roofline
    arm = parse_arm("lookahead:w=4,n=3,g=4,k=2,alpha=0.5", cost, deployment)
    assert arm.name == "lookahead-w4n3g4-k2" and arm.k_for(1) == 2
    for batch in (1, 64):
        # a step verifies 1 + W(N-1) + G(N-1) = 17 positions: 1 + k in the verification, the rest as drafting
        total = cost.step_times(batch, 3, [batch * 500.0]) + arm.draft.draft_times(batch, 2, [batch * 500.0], None)
        assert total[0] == pytest.approx(cost.step_times(batch, 17, [batch * 500.0])[0])
    longer = parse_arm("lookahead:w=4,n=3,g=4,alpha=0.5", cost, deployment)       # k 4: prompt lookup's 4 tokens
    assert longer.k_for(1) == 4 and longer.draft.rows == 18
    with pytest.raises(ConfigError, match="at most max\\(k, n - 1\\) = 4"):
        parse_arm("lookahead:policy=1=6/8=2,alpha=0.5", cost, deployment)
    with pytest.raises(ConfigError, match="lookahead arms only"):
        parse_arm("ngram:w=4,alpha=0.5", cost, deployment)
    with pytest.raises(ConfigError, match="N \\(n-gram size\\) in 2..6"):
        parse_arm("lookahead:n=9,alpha=0.5", cost, deployment)


def test_calc_throughput_and_simulate_take_lookahead(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="specwise")
    calc_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["calc", "throughput", "--method", "lookahead", "--lookahead", "4,3,4", "--alpha", "0.5",
                              "--k", "2", "--batch-sizes", "1,64"])
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    assert "16 rows" in out and "stops paying" in out
    assert main(["simulate", "--arm", "lookahead:w=2,n=3,g=2,alpha=0.5", "--concurrency", "1",
                 "--output", str(tmp_path / "sim"), "--num-requests", "4"]) == 0
    assert {r.arm for r in read_records(tmp_path / "sim")} == {"off", "lookahead-w2n3g2-k4"}


def test_estimate_says_lookahead_cannot_be_replayed_from_a_log(tmp_path, capsys):
    assert main(["estimate", "--log", str(tmp_path / "none.jsonl"), "--method", "lookahead"]) == 2
    assert "cannot replay it from a log" in capsys.readouterr().err
