"""`specwise estimate`: from a log of our engine's own greedy outputs, the n-gram estimate equals the
acceptance the engine measured generating them, exactly (same k, same prompts); the teacher-forced
layer_skip estimate is within float rounding of the engine's layer_skip run; log shapes, bad rows, methods not yet
available, per-category figures and the speedup through the calculators."""

import json

import pytest
from tiny_checkpoints import make_tiny_hf_config, write_hf_checkpoint
from tiny_models import byte_tokenizer, random_weights, tiny_checkpoint

from specwise.bench.inputs.bad_rows import BadRows
from specwise.calc.deployment import Deployment, DeploymentConfig
from specwise.calc.roofline import RooflineCost
from specwise.cli import main
from specwise.engine.llm import LLM
from specwise.engine.spec_decode.metrics import SpecStats
from specwise.errors import InputError
from specwise.models.checkpoints.loader import load_checkpoint
from specwise.models.config import ModelConfig
from specwise.monitor.estimate import estimate_acceptance, expected_speedup
from specwise.monitor.logs import parse_line, read_log
from specwise.monitor.replay import NgramDrafter, replay
from specwise.monitor.scoring import TeacherForcedDrafter
from specwise.sampling_params import SamplingParams

ENGINE = dict(num_kv_blocks=512, block_size=4, max_model_len=192, max_num_batched_tokens=1024)
PROMPTS = [   # (text, max_tokens, category): repeats give the n-gram drafter something to find
    ("def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return", 40, "code"),
    ("The quick brown fox jumps over the lazy dog. The quick brown fox", 28, "chat"),
    ("x", 33, "chat"),
    ("for i in range(10):\n    print(add(i, 2 * i))\nfor i in range(10):\n", 36, "code"),
    ("abcabcabcabcabcabcabc", 50, "code"),
    ("Numbers: 12345, 2024-06-01, 3.14159", 19, "chat"),
]


def generate_log(path, speculative: str, k: int, checkpoint=None):
    """Run the engine greedily over PROMPTS in one continuous batch; write a token-id log.
    Returns the per-request SpecStats the engine measured, in prompt order."""
    llm = LLM(checkpoint=checkpoint or tiny_checkpoint(), speculative=speculative, num_speculative_tokens=k,
              **ENGINE)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for _, m, _ in PROMPTS]
    outputs = llm.generate([text for text, _, _ in PROMPTS], params)
    with open(path, "w") as log:
        for (text, max_tokens, category), output in zip(PROMPTS, outputs):
            log.write(json.dumps({"prompt_token_ids": output.prompt_token_ids,
                                  "completion_token_ids": output.output_token_ids,
                                  "max_tokens": max_tokens, "category": category}) + "\n")
    return [output.spec for output in outputs], llm.engine.stats


def counters(stats: SpecStats) -> tuple:
    return stats.drafts, stats.draft_tokens, stats.accepted_tokens, list(stats.accepted_per_position)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_ngram_estimate_equals_what_the_engine_measured_exactly(tmp_path, k):
    measured, engine_total = generate_log(tmp_path / "log.jsonl", "ngram", k)
    assert engine_total.drafts > 0 and engine_total.accepted_tokens > 0      # the test exercises acceptance
    requests = list(read_log(tmp_path / "log.jsonl", None, BadRows()))
    drafter = NgramDrafter(2, 4)
    for request, engine_stats in zip(requests, measured):
        estimated = replay(drafter, request.prompt_token_ids, request.completion_token_ids, k, request.max_tokens)
        assert counters(estimated) == counters(engine_stats), request.line
    total = estimate_acceptance(iter(requests), drafter, "ngram", k)
    assert counters(total.overall.stats) == counters(engine_total)
    assert total.overall.stats.acceptance_rate == engine_total.acceptance_rate
    assert total.overall.stats.mean_acceptance_length == engine_total.mean_acceptance_length
    assert set(total.categories) == {"code", "chat"}
    assert total.categories["code"].requests == 3


def test_ngram_estimate_from_the_command_line(tmp_path, capsys):
    _, engine_total = generate_log(tmp_path / "log.jsonl", "ngram", 4)
    out = tmp_path / "estimate.json"
    code = main(["estimate", "--log", str(tmp_path / "log.jsonl"), "--method", "ngram", "--k", "4",
                 "--json-out", str(out), "--no-progress", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                 "--concurrency", "1,64"])
    printed = capsys.readouterr().out
    assert code == 0
    overall = json.loads(out.read_text())["overall"]
    assert (overall["drafts"], overall["draft_tokens"], overall["accepted_tokens"]) == \
        (engine_total.drafts, engine_total.draft_tokens, engine_total.accepted_tokens)
    assert "acceptance on the logged traffic" in printed and "expected decode throughput" in printed
    assert "code" in printed and "chat" in printed


def test_layer_skip_teacher_forced_estimate_matches_the_engine(tmp_path):
    checkpoint = tiny_checkpoint(num_layers=3)
    measured, engine_total = generate_log(tmp_path / "log.jsonl", "layer_skip:1", 3, checkpoint)
    from specwise.models.checkpoints.loader import build_model
    import torch
    model = build_model(checkpoint, torch.float32, "cpu", 512)
    drafter = TeacherForcedDrafter(model, torch.float32, "cpu", num_layers=1)
    result = estimate_acceptance(read_log(tmp_path / "log.jsonl", None, BadRows()), drafter, "layer_skip:1", 3)
    estimated = result.overall.stats
    # teacher forcing runs one full-prefix forward where the engine drafts incrementally from its cache:
    # the same greedy chain up to float rounding, so an argmax near-tie may flip a token or two
    assert abs(estimated.drafts - engine_total.drafts) <= 0.03 * engine_total.drafts
    assert estimated.acceptance_rate == pytest.approx(engine_total.acceptance_rate, abs=0.02)


def test_teacher_forced_drafter_chains_greedy_predictions():
    """A drafter that is the target itself predicts the target's own greedy output: all accepted."""
    import torch
    from specwise.models.checkpoints.loader import build_model
    checkpoint = tiny_checkpoint()
    llm = LLM(checkpoint=checkpoint, **ENGINE)
    output = llm.generate("abcabc hello", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    drafter = TeacherForcedDrafter(build_model(checkpoint, torch.float32, "cpu", 512), torch.float32, "cpu")
    stats = replay(drafter, output.prompt_token_ids, output.output_token_ids, 4, 20)
    assert stats.drafts > 0 and stats.accepted_tokens == stats.draft_tokens


def test_replay_worked_example():
    stats = replay(NgramDrafter(1, 1), [5, 8, 9], [5, 8, 9, 7], k=3)
    assert counters(stats) == (1, 2, 2, [1, 1])


def test_model_drafter_from_the_command_line(tmp_path, capsys):
    config = make_tiny_hf_config(num_hidden_layers=2)
    target = write_hf_checkpoint(tmp_path / "target", config, random_weights(ModelConfig.from_hf(config), 0))
    tokenizer = load_checkpoint(target).tokenizer
    with open(tmp_path / "log.jsonl", "w") as log:
        log.write(json.dumps({"prompt": "the cat sat on the mat. the cat", "completion": " sat on the mat.",
                              "category": "chat"}) + "\n")
        log.write(json.dumps({"request": {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 9},
                              "response": {"choices": [{"message": {"content": "hello hello hello"},
                                                        "finish_reason": "length"}]}}) + "\n")
    for method in ("layer_skip:1", f"draft:{target}"):
        code = main(["estimate", "--log", str(tmp_path / "log.jsonl"), "--method", method, "--k", "3",
                     "--target", str(target), "--no-progress", "--draft-cost", "0.5"])
        assert code == 0, method
    assert "layer_skip:1, k = 3" in capsys.readouterr().out
    assert tokenizer.encode(" sat", add_special_tokens=False)


def test_log_shapes():
    tokenizer = byte_tokenizer()
    plain = parse_line({"prompt": "ab", "completion": "cd", "category": "x"}, 1, tokenizer)
    assert plain.prompt_token_ids == tokenizer.encode("ab") and plain.prompt_token_ids[0] == 256      # BOS
    assert plain.completion_token_ids == tokenizer.encode("cd", add_special_tokens=False)
    assert plain.category == "x"
    openai = parse_line({"request": {"prompt": "ab", "max_tokens": 5, "temperature": 0.7},
                         "response": {"choices": [{"text": "cd"}]}}, 2, tokenizer)
    assert openai.completion_token_ids == plain.completion_token_ids and openai.max_tokens == 5 and openai.temperature == 0.7
    chat = parse_line({"body": {"messages": [{"role": "user", "content": "q"}]},
                       "response": {"body": {"choices": [{"message": {"content": "a"}}]}}}, 3, tokenizer)
    assert chat.prompt_token_ids == tokenizer.apply_chat_template([{"role": "user", "content": "q"}])
    ids = parse_line({"prompt_token_ids": [1, 2], "completion_token_ids": [3]}, 4, None)
    assert ids.category == "*"


def test_evaluate_records_are_refused_with_a_reason(tmp_path):
    record = {"arm": "ngram-k4", "method": "ngram", "load_kind": "concurrency", "load_value": 1,
              "category": "chat", "request_id": "r", "prompt_tokens": 5, "output_tokens": 9, "send_time": 0}
    (tmp_path / "requests.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(InputError, match="requests.jsonl:1: this is a `specwise evaluate` requests.jsonl"):
        list(read_log(tmp_path / "requests.jsonl", byte_tokenizer(), BadRows(skip=True)))


def test_bad_lines_name_file_and_line_or_are_skipped_and_counted(tmp_path, capsys):
    good = json.dumps({"prompt_token_ids": [1, 2, 3, 1, 2], "completion_token_ids": [3, 1, 2, 3]})
    lines = [good, "{not json", json.dumps({"prompt_token_ids": [1], "completion_token_ids": "x"}), good, ""]
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(lines) + "\n")
    stream = read_log(path, None, BadRows())
    assert next(stream).line == 1                         # streamed: line 1 is read before line 2 fails
    with pytest.raises(InputError, match=r"log.jsonl:2: not valid JSON \(use --skip-bad-rows"):
        next(stream)
    assert main(["estimate", "--log", str(path), "--no-progress"]) == 2
    assert "log.jsonl:2: not valid JSON" in capsys.readouterr().err
    assert main(["estimate", "--log", str(path), "--no-progress", "--skip-bad-rows"]) == 0
    out = capsys.readouterr().out
    assert "skipped 2 bad line(s)" in out and "log.jsonl:2" in out


@pytest.mark.parametrize("method, message", [
    ("suffix", "not available yet"), ("eagle:/models/eagle", "not available yet"),
    ("medusa", "not available yet"), ("tree", "unknown speculative method"),
    ("layer_skip:x", "whole number of layers"),
])
def test_methods_not_available_give_clear_errors(tmp_path, method, message, capsys):
    assert main(["estimate", "--log", str(tmp_path / "none.jsonl"), "--method", method]) == 2
    assert message in capsys.readouterr().err


def test_speedup_through_the_calculator_pays_at_low_concurrency_and_less_at_high(tmp_path):
    generate_log(tmp_path / "log.jsonl", "ngram", 4)
    result = estimate_acceptance(read_log(tmp_path / "log.jsonl", None, BadRows()), NgramDrafter(2, 4), "ngram", 4)
    deployment = Deployment.from_config(DeploymentConfig(model="llama-3.1-8b", gpu="h100-sxm"))
    rows = expected_speedup(result.overall, "ngram", 4, RooflineCost(deployment), deployment, [1, 256], None)
    assert rows[0].ratio > 1.0 and rows[1].ratio < rows[0].ratio
