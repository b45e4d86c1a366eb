"""`specwise calc ...` and `specwise simulate` from the command line."""

import argparse
import json

import pytest

from specwise.bench.results import RequestRecord, read_records, read_run_info
from specwise.calc import cli as calc_cli
from specwise.errors import ConfigError, InputError
from specwise.sim import cli as sim_cli


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="specwise")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for room in (calc_cli, sim_cli):
        room.register(subparsers)
    args = parser.parse_args(argv)
    return args.handler(args)


def test_speedup(capsys):
    assert run(["calc", "speedup", "--alpha", "0.8", "--draft-cost", "0.05", "--k", "4"]) == 0
    out = capsys.readouterr().out
    assert "best k = 8 (3.09x)" in out and "at k = 4: 2.80x" in out and "below alpha = 0.050" in out


def test_speedup_from_positions(capsys):
    assert run(["calc", "speedup", "--positions", "0.9,0.8,0.6", "--draft-cost", "0.1"]) == 0
    assert "best k = 3" in capsys.readouterr().out


def test_latency(capsys):
    assert run(["calc", "latency", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "4",
                "--prompt-tokens", "1000", "--output-tokens", "200", "--batch-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "memory-bound" in out and "fits" in out


def test_latency_that_does_not_fit(capsys):
    assert run(["calc", "latency", "--model", "llama-3.1-70b", "--gpu", "l4"]) == 0
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_latency_with_a_measured_profile(tmp_path, capsys):
    profile = {"format": "specwise-step-profile", "version": 1, "machine": "lab box", "model": "toy",
               "batch_sizes": [1], "tokens_per_seq": [1, 1024], "context_lens": [0, 4096],
               "seconds": [[[0.010, 0.012], [0.100, 0.110]]]}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    assert run(["calc", "latency", "--profile", str(path), "--prompt-tokens", "1024"]) == 0
    assert "measured profile: toy on lab box" in capsys.readouterr().out


def test_throughput(capsys):
    assert run(["calc", "throughput", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--prompt-tokens", "200",
                "--output-tokens", "200", "--k", "4", "--alpha", "0.8", "--drafter", "llama-3.2-1b"]) == 0
    out = capsys.readouterr().out
    assert "speculation pays from batch size 1, stops paying from" in out and "KV cache holds" in out


def test_catalog(capsys):
    assert run(["calc", "catalog"]) == 0
    out = capsys.readouterr().out
    assert "mi300x" in out and "smollm2-135m" in out


def test_user_errors_are_config_errors():
    with pytest.raises(ConfigError):
        run(["calc", "latency", "--gpu", "h900"])
    with pytest.raises(ConfigError):
        run(["calc", "throughput", "--alpha", "0.7"])
    with pytest.raises(ConfigError):
        run(["simulate", "--arm", "draft:k=4"])
    with pytest.raises(InputError):
        run(["simulate", "--trace", "/nonexistent/trace.csv"])


def test_simulate_writes_evaluate_results(tmp_path, capsys):
    out_dir = tmp_path / "sim"
    assert run(["simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", "suite:chat,code_editing",
                "--per-category", "2", "--max-tokens", "32", "--concurrency", "1,4",
                "--arm", "ngram:k=3,alpha=0.6", "--arm", "draft:policy=1=4/4=1,alpha=0.7,drafter=llama-3.2-1b",
                "--output", str(out_dir)]) == 0
    info = read_run_info(out_dir)
    assert info["tool"] == "simulate" and info["baseline"] == "off"
    assert [arm["name"] for arm in info["arms"]] == ["off", "ngram-k3", "draft-adaptive"]
    assert info["loads"] == [{"kind": "concurrency", "value": 1}, {"kind": "concurrency", "value": 4}]
    records = read_records(out_dir)
    assert len(records) == 3 * (24 + 24)                      # evaluate's default: max(4 x c, 24) requests
    assert {r.category for r in records} == {"chat", "code_editing"}
    assert "ngram-k3" in capsys.readouterr().out


def test_simulate_takes_the_calibrated_servers_token_budget_from_the_profile(tmp_path, capsys):
    """A profile calibrate --endpoint wrote records the server's token budget: simulate schedules with it
    unless --max-num-batched-tokens says otherwise."""
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"format": "specwise-step-profile", "version": 1, "model": "m", "machine": "endpoint",
                                   "linear": {"fixed_s": 0.03, "per_token_s": 5e-4, "per_kv_token_s": 5e-6},
                                   "calibration": {"design": {"max_num_batched_tokens": 512}}}))
    common = ["simulate", "--model", "smollm2-135m", "--gpu", "l4", "--workload", "suite:chat", "--per-category", "2",
              "--max-tokens", "8", "--concurrency", "1", "--profile", str(profile)]
    for extra, budget in (([], 512), (["--max-num-batched-tokens", "2048"], 2048)):
        out_dir = tmp_path / f"sim-{budget}"
        assert run([*common, *extra, "--output", str(out_dir)]) == 0
        assert read_run_info(out_dir)["simulation"]["server"]["max_num_batched_tokens"] == budget
        said = "the calibrated server takes at most 512 tokens a step" in capsys.readouterr().out
        assert said == (not extra)


def test_simulate_trace_with_length_overrides(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.00,100,5\n"
                     "2023-11-16 18:15:47.50,200,7\n")
    out_dir = tmp_path / "sim"
    assert run(["simulate", "--trace", str(trace), "--time-scale", "0.5", "--output-tokens", "9",
                "--arm", "ngram:k=2,alpha=0.5", "--output", str(out_dir)]) == 0
    records = read_records(out_dir)
    assert sorted(r.send_time for r in records if r.arm == "off") == pytest.approx([0.0, 3.0])
    assert {r.output_tokens for r in records} == {9} and {r.load_kind for r in records} == {"trace"}


def test_simulate_takes_prompt_lengths_and_duration_like_a_measured_run(tmp_path):
    measured = tmp_path / "measured"
    measured.mkdir()
    rows = [RequestRecord(arm="off", method="off", load_kind="concurrency", load_value=1, category="chat",
                          request_id=request_id, prompt_tokens=tokens, output_tokens=8, send_time=0.0)
            for request_id, tokens in (("warmup:chat-01", 47), ("chat-01#2", 47), ("chat-02", 61))]
    (measured / "requests.jsonl").write_text("".join(row.to_json() + "\n" for row in rows))
    out_dir = tmp_path / "sim"
    assert run(["simulate", "--model", "smollm2-135m", "--gpu", "l4", "--workload", "suite:chat", "--per-category", "3",
                "--concurrency", "2", "--duration", "0.01", "--prompt-tokens-from", str(measured), "--order", "file",
                "--output", str(out_dir)]) == 0
    records = read_records(out_dir)
    # nothing is sent after 10 ms: the first wave of two, with the lengths the measured run counted
    assert sorted((r.request_id, r.prompt_tokens) for r in records) == [("chat-01", 47), ("chat-02", 61)]
    assert read_run_info(out_dir)["workload"]["prompt_tokens_estimated"] == 1      # chat-03 was not measured


def test_simulate_takes_output_lengths_from_a_measured_run(tmp_path):
    """Where each request stopped (EOS) in the measured run, the baseline arm's where both have it."""
    measured = tmp_path / "measured"
    measured.mkdir()
    rows = [RequestRecord(arm=arm, method=arm, load_kind="concurrency", load_value=1, category="chat",
                          request_id=request_id, prompt_tokens=40, output_tokens=tokens, send_time=0.0)
            for arm, request_id, tokens in (("off", "chat-01", 5), ("ngram", "chat-01", 6), ("ngram", "chat-02", 9))]
    (measured / "requests.jsonl").write_text("".join(row.to_json() + "\n" for row in rows))
    (measured / "run.json").write_text(json.dumps({"baseline": "off"}))
    out_dir = tmp_path / "sim"
    assert run(["simulate", "--model", "smollm2-135m", "--gpu", "l4", "--workload", "suite:chat", "--per-category", "3",
                "--concurrency", "1", "--output-tokens-from", str(measured), "--order", "file", "--max-tokens", "64",
                "--output", str(out_dir)]) == 0
    lengths = {r.request_id.partition("#")[0]: r.output_tokens for r in read_records(out_dir) if r.arm == "off"}
    assert lengths == {"chat-01": 5, "chat-02": 9, "chat-03": 64}
