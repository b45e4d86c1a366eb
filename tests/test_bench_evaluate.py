"""`specwise evaluate` end to end against local OpenAI-compatible servers, and Ctrl-C."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specwise.bench.config import EvaluateConfig
from specwise.bench.evaluate import evaluate
from specwise.bench.report.render import render_report
from specwise.bench.results import read_records, read_run_info
from specwise.errors import ConfigError
from test_bench_http import SSEServer

ROOT = Path(__file__).resolve().parents[1]


def endpoint_config(tmp_path, *endpoints, **overrides) -> EvaluateConfig:
    settings = dict(endpoint=list(endpoints), workload="suite:code_editing,chat", per_category=2,
                    concurrency="1,4", num_requests=8, max_tokens=12, warmup=1, output=str(tmp_path / "out"),
                    progress=False, slo="ttft=2s")
    settings.update(overrides)
    return EvaluateConfig(**settings)


def test_a_dead_endpoint_stops_the_run_before_measuring(tmp_path):
    with SSEServer() as gone:
        dead = gone.url                                     # closed by the time the run starts
    with SSEServer() as plain, pytest.raises(ConfigError, match="endpoint 'down' at .* does not answer"):
        evaluate(endpoint_config(tmp_path, f"vllm-off={plain.url}", f"down={dead}"), argv=["evaluate"])
    assert not (tmp_path / "out" / "requests.jsonl").exists()


def test_endpoints_side_by_side_with_failures(tmp_path):
    with SSEServer() as plain, SSEServer(tokens_per_chunk=3, fail_every=4) as spec:
        outcome = evaluate(endpoint_config(tmp_path, f"vllm-off={plain.url}", f"vllm-ngram={spec.url}"),
                           argv=["evaluate"])
    records = [r for r in read_records(outcome.results_dir) if not r.warmup]
    assert len(records) == 2 * 2 * 8
    assert all(r.error is None for r in records if r.arm == "vllm-off")
    failed = [r for r in records if r.arm == "vllm-ngram" and r.error]
    assert failed and all(r.error == "HTTP 500: overloaded, try later" for r in failed)

    summary = json.loads(outcome.report.summary_json.read_text())
    overall = {(r["arm"], r["load_value"]): r for r in summary["rows"] if r["category"] == "all"}
    assert overall[("vllm-ngram", 1)]["metrics"]["errors"] == len([r for r in failed if r.load_value == 1])
    accepted = overall[("vllm-ngram", 1)]["metrics"]["acceptance"]
    assert accepted["source"] == "vllm" and accepted["rate"] == pytest.approx(1.0)
    assert overall[("vllm-off", 1)]["metrics"]["acceptance"] is None              # unknown, not zero
    # paired: the ratios at concurrency 1 use only the requests both arms completed
    assert overall[("vllm-ngram", 1)]["paired"] == 8 - len([r for r in failed if r.load_value == 1])
    assert overall[("vllm-off", 4)]["metrics"]["goodput"] is not None
    run = read_run_info(outcome.results_dir)
    assert run["baseline"] == "vllm-off" and run["finished"] and run["slo"] == {"ttft": 2.0}
    assert "Errors" in outcome.report.summary_md.read_text()


def test_trace_replay_synthesizes_prompts_and_forces_lengths(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 100 * i, "input_length": 30 + i, "output_length": 4 + i})
                             + "\n" for i in range(5)))
    with SSEServer() as server:
        outcome = evaluate(endpoint_config(tmp_path, f"off={server.url}", trace=str(trace), time_scale=10.0,
                                           concurrency=None, num_requests=None, max_tokens=None,
                                           trace_category="code_editing"), argv=[])
        bodies = server.bodies
    records = [r for r in read_records(outcome.results_dir) if not r.warmup]
    assert [(r.load_kind, r.load_value, r.category) for r in records] == [("trace", 10.0, "trace")] * 5
    assert sorted(r.output_tokens for r in records) == [4, 5, 6, 7, 8]
    replayed = bodies[1:]                                   # after the warm-up
    assert all(b["ignore_eos"] and b["min_tokens"] == b["max_tokens"] for b in replayed)
    assert sorted(len(b["prompt"]) for b in replayed) == [4 * n for n in range(30, 35)]
    sent = sorted(r.send_time for r in records)
    assert sent[-1] - sent[0] >= 0.04 - 0.01                # 400 ms of trace at 10x


def test_existing_results_are_not_overwritten(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "requests.jsonl").write_text("")
    with pytest.raises(ConfigError, match="already holds results"):
        evaluate(endpoint_config(tmp_path, "off=http://127.0.0.1:9"))


def test_unknown_baseline(tmp_path):
    with pytest.raises(ConfigError, match="--baseline 'plain' is not an arm"):
        evaluate(endpoint_config(tmp_path, "off=http://127.0.0.1:9", baseline="plain"))


def test_interrupted_run_keeps_finished_requests_and_reports(tmp_path):
    output = tmp_path / "out"
    with SSEServer(delay=0.05) as off, SSEServer(delay=0.05, tokens_per_chunk=2) as spec:
        command = [sys.executable, "-m", "specwise.cli", "evaluate", "--endpoint", f"off={off.url}",
                   "--endpoint", f"ngram={spec.url}", "--workload", "suite:chat", "--per-category", "3",
                   "--concurrency", "2", "--num-requests", "40", "--max-tokens", "10", "--warmup", "0",
                   "--output", str(output), "--no-progress"]
        # Ctrl-C in a terminal: SIGINT at its default. A test run started in the background (`cmd &` in a script)
        # ignores SIGINT, children inherit that, and Python then never raises KeyboardInterrupt
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=dict(os.environ, PYTHONPATH=str(ROOT)),
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and _lines(output / "requests.jsonl") < 3:
                time.sleep(0.1)
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=60)
        finally:
            process.kill()
    assert process.returncode == 130, stderr
    assert "interrupted: finished requests kept in" in stderr
    records = read_records(output)
    assert 3 <= len(records) < 80 and all(r.error is None for r in records)
    assert read_run_info(output)["interrupted"] is True
    assert (output / "report.html").exists()
    (output / "report.html").unlink()
    assert render_report(output).report_html.exists()


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_duration_bounds_a_point_and_cuts_off_stragglers(tmp_path):
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"prompt": "quick", "max_tokens": 2}) + "\n"
                        + json.dumps({"prompt": "slow", "max_tokens": 40}) + "\n")
    with SSEServer(delay=0.05, hang_after=2) as server:
        outcome = evaluate(endpoint_config(tmp_path, f"off={server.url}", workload=str(workload), concurrency="1",
                                           num_requests=2, duration=1.0, warmup=0, max_tokens=None, order="file"),
                           argv=[])
    # the quick request (2 chunks, ~0.1 s) is the first wave (always measured); the slow one, sent next,
    # hangs after 2 chunks: at 2 x 1 s it is cancelled, not recorded, and counted
    assert [r.request_id for r in read_records(outcome.results_dir)] == ["w:1"]
    assert read_run_info(outcome.results_dir)["cut_off"] == [
        {"requests": 1, "arm": "off", "load_kind": "concurrency", "load_value": 1}]
    assert "1 request(s) still running at twice --duration were cut off" in outcome.report.summary_md.read_text()


def test_a_closed_loop_point_always_measures_its_first_wave(tmp_path):
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"prompt": "quick", "max_tokens": 2}) + "\n"
                        + json.dumps({"prompt": "slow", "max_tokens": 20}) + "\n")
    with SSEServer(delay=0.05) as server:
        outcome = evaluate(endpoint_config(tmp_path, f"off={server.url}", workload=str(workload), concurrency="2",
                                           num_requests=2, duration=0.2, warmup=0, max_tokens=None, order="file"),
                           argv=[])
    # the slow request (1 s) outlives twice --duration, but it is in the first wave of 2
    assert sorted(r.request_id for r in read_records(outcome.results_dir)) == ["w:1", "w:2"]
    assert "cut_off" not in read_run_info(outcome.results_dir)


def test_open_loop_rate_points(tmp_path):
    with SSEServer() as server:
        outcome = evaluate(endpoint_config(tmp_path, f"off={server.url}", concurrency=None, rate="50,100",
                                           burstiness=0.5, num_requests=5, warmup=0), argv=[])
    records = read_records(outcome.results_dir)
    assert sorted({(r.load_kind, r.load_value) for r in records}) == [("rate", 50.0), ("rate", 100.0)]
    assert len(records) == 10 and all(r.error is None for r in records)
    assert "50 req/s" in outcome.report.summary_md.read_text()


def test_a_workload_file_with_timestamps_replays_as_a_trace(tmp_path):
    workload = tmp_path / "mine.jsonl"
    workload.write_text("".join(json.dumps({"prompt": f"question {i}", "timestamp": 50.0 + i / 10,
                                            "category": "support", "max_tokens": 3}) + "\n" for i in range(4)))
    with SSEServer() as server:
        outcome = evaluate(endpoint_config(tmp_path, f"off={server.url}", trace=str(workload), concurrency="2",
                                           num_requests=4, warmup=0), argv=[])
        prompts = [body["prompt"] for body in server.bodies]
    records = read_records(outcome.results_dir)
    assert sorted({(r.load_kind, r.load_value) for r in records}) == [("concurrency", 2), ("trace", 1.0)]
    assert {r.category for r in records} == {"support"}
    assert prompts[:4] == [f"question {i}" for i in range(4)]            # replayed in timestamp order
    assert read_run_info(outcome.results_dir)["workload"]["source"] == f"workload replay {workload}"


@pytest.mark.slow
def test_our_own_server_as_two_endpoint_arms(tmp_path):
    """The real specwise server (tiny model): usage and per-request acceptance from the stream,
    and the same counters again, summed, from its specwise: Prometheus metrics."""
    from test_bench_engine import PROMPTS
    from test_server_harness import serve, tiny_engine

    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps(prompt) + "\n" for prompt in PROMPTS))
    with serve(tiny_engine(speculative=None)) as plain, serve(tiny_engine(speculative="ngram:1-3")) as spec:
        outcome = evaluate(endpoint_config(tmp_path, f"specwise-off={plain.base_url}",
                                           f"specwise-ngram={spec.base_url}", workload=str(workload),
                                           concurrency="1,3", num_requests=6, max_tokens=None), argv=[])
    records = [r for r in read_records(outcome.results_dir) if not r.warmup]
    assert len(records) == 24 and all(r.error is None for r in records)
    assert all(r.drafts is None for r in records if r.arm == "specwise-off")
    server = {entry["load_value"]: entry for entry in read_run_info(outcome.results_dir)["server_acceptance"]
              if entry["arm"] == "specwise-ngram"}
    for load in (1, 3):
        mine = [r for r in records if r.arm == "specwise-ngram" and r.load_value == load]
        assert sum(r.drafts for r in mine) == server[load]["drafts"]
        assert sum(r.accepted_tokens for r in mine) == server[load]["accepted_tokens"]
    assert sum(r.drafts for r in records if r.arm == "specwise-ngram") > 0


def test_api_key_is_sent_and_never_saved(tmp_path):
    with SSEServer() as server:
        outcome = evaluate(endpoint_config(tmp_path, f"off={server.url}", api_key="sk-secret", concurrency="1",
                                           num_requests=1, warmup=0),
                           argv=["evaluate", "--api-key", "sk-secret", "--api-key=sk-secret"])
        sent = server.authorization
    assert sent == ["Bearer sk-secret"]
    saved = (outcome.results_dir / "run.json").read_text() + outcome.report.summary_json.read_text()
    assert "sk-secret" not in saved
