"""`specwise evaluate --engine`: servers launched per arm, against a fake engine (tests/fake_engine.py).

Every test checks that no process it caused is left (by PID: the fake engine writes its own
and its helper child's pid into FAKE_ENGINE_PID_DIR), whatever way the run ended.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from specwise.bench.evaluate import evaluate
from specwise.bench.launch import memory, server as launch_server
from specwise.bench.launch.config import LaunchConfig
from specwise.bench.launch.command import build_command, free_port
from specwise.bench.launch.server import LaunchError, LaunchedServer, stop_all
from specwise.bench.load.arms import parse_engine_methods
from specwise.bench.results import read_records
from specwise.errors import ConfigError

from fake_engine import CACHE_BLOCK_SIZE, CACHE_BLOCKS
from launch_fixtures import DEADLINE, FAKE, ROOT, alive, pids, run_config, settings, wait_for


def test_side_by_side_measures_both_arms_and_reads_acceptance_per_request(tmp_path, fake):
    limits = "--max-num-seqs 32 --max-num-batched-tokens 512"
    outcome = evaluate(run_config(tmp_path), argv=[], launch=settings(pairing="side-by-side", engine_args=limits))
    records = [r for r in read_records(outcome.results_dir) if not r.warmup]
    assert {r.arm for r in records} == {"off", "ngram-k4"} and not any(r.error for r in records)
    speculative = [r for r in records if r.arm == "ngram-k4"]
    assert all(r.drafts and r.draft_tokens == 4 * r.drafts for r in speculative)     # from each response
    run = json.loads((outcome.results_dir / "run.json").read_text())
    launch = run["launch"]
    assert launch["pairing"] == "side-by-side" and launch["restarts"] == 0
    assert [s["version"] for s in launch["servers"]] == ["0.0.1-fake"] * 2
    ngram = launch["servers"][1]
    assert "--per-request-spec-decode-metrics" in ngram["argv"] and "--speculative-config" in ngram["argv"]
    assert Path(ngram["log"]).read_text().count("fake engine serving") == 1
    assert all(entry["requests_agree"] for entry in run["server_acceptance"] if entry["arm"] == "ngram-k4")
    # for simulate --validate: each server's KV cache as its /metrics says it (vllm:cache_config_info), its
    # limits as its command line set them (vLLM says them nowhere)
    said = {"max_num_seqs": 32, "max_num_batched_tokens": 512, "block_size": CACHE_BLOCK_SIZE,
            "kv_cache_tokens": CACHE_BLOCK_SIZE * CACHE_BLOCKS}
    assert run["said"] == {"off": said, "ngram-k4": said}
    summary = outcome.report.summary_md.read_text()
    assert "Servers launched by specwise: vllm 0.0.1-fake, paired side-by-side" in summary
    assert ngram["command"] in summary
    assert not launch_server.LIVE


def test_blocks_restart_at_each_change_of_arm_and_warm_up_after_each_start(tmp_path, fake):
    outcome = evaluate(run_config(tmp_path, concurrency="1"), argv=[], launch=settings(blocks=2))
    run = json.loads((outcome.results_dir / "run.json").read_text())
    assert run["schedule"]["kind"] == "blocks" and run["launch"]["pairing"] == "blocks"
    # warm-up ngram, then off (up for the first block); blocks off ngram | ngram off: a start per change of arm
    assert [s["starts"] for s in run["launch"]["servers"]] == [2, 2]
    assert run["launch"]["restarts"] == 2
    warmups = [r for r in read_records(outcome.results_dir) if r.warmup]
    assert len(warmups) == 4                                # one per start
    summary = outcome.report.summary_md.read_text()
    assert "2 restart(s)" in summary and "Acceptance of ngram-k4 is read from each response" in summary


def test_blocks_compare_each_responses_acceptance_with_prometheus_read_around_every_block(tmp_path, fake):
    """A restart zeroes the server's counters: each block's difference (warm-up excluded) is summed."""
    outcome = evaluate(run_config(tmp_path, concurrency="1,2", num_requests=8), argv=[], launch=settings(blocks=4))
    run = json.loads((outcome.results_dir / "run.json").read_text())
    records = [r for r in read_records(outcome.results_dir) if not r.warmup and r.arm == "ngram-k4"]
    entries = [entry for entry in run["server_acceptance"] if entry["arm"] == "ngram-k4"]
    assert [entry["load_value"] for entry in entries] == [1, 2] and all(entry["blocks"] == 4 for entry in entries)
    for entry in entries:
        mine = [r for r in records if r.load_value == entry["load_value"]]
        assert (entry["drafts"], entry["draft_tokens"], entry["accepted_tokens"]) == (
            sum(r.drafts for r in mine), sum(r.draft_tokens for r in mine), sum(r.accepted_tokens for r in mine))
        assert entry["drafts"] > 0 and entry["requests_agree"] is True
    assert run["launch"]["restarts"] > 4            # the counters were read across several lives of the server
    assert "(read around each block and summed: a restart zeroes them) agree" in outcome.report.summary_md.read_text()


def test_start_timeout_is_one_line_with_the_log_tail(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("FAKE_ENGINE_HANG", "1")
    with pytest.raises(LaunchError) as error:
        evaluate(run_config(tmp_path), argv=[], launch=settings(start_timeout=1.0))
    message = str(error.value)
    assert "\n" not in message and "not ready after 1 s" in message and message.endswith("loading weights for "
                                                                                         "['serve', '/models/hf']")
    run = json.loads((tmp_path / "results" / "run.json").read_text())
    assert run["launch_error"] == message


def test_rejected_flag_reported_with_the_engines_message_before_measuring(tmp_path, fake):
    with pytest.raises(LaunchError) as error:
        evaluate(run_config(tmp_path), argv=[], launch=settings(engine_args="--bogus 1", pairing="side-by-side"))
    message = str(error.value)
    assert "\n" not in message and "arm off: the server exited during start-up (exit code 2)" in message
    assert "fake_engine: error: unrecognized arguments: --bogus 1" in message
    assert not read_records(tmp_path / "results")


@pytest.mark.parametrize("pairing", ["side-by-side", "blocks"])
def test_server_exiting_mid_run_ends_its_requests_as_errors_and_the_run_goes_on(tmp_path, fake, monkeypatch,
                                                                               pairing):
    monkeypatch.setenv("FAKE_ENGINE_CRASH_AFTER", "3")      # warm-up is the 1st request
    monkeypatch.setenv("FAKE_ENGINE_CRASH_SPEC", "1")
    outcome = evaluate(run_config(tmp_path, concurrency="1"), argv=[], launch=settings(pairing=pairing))
    records = [r for r in read_records(outcome.results_dir) if not r.warmup]
    failed = [r for r in records if r.error]
    assert failed and all(r.arm == "ngram-k4" for r in failed)
    assert "the server of arm ngram-k4 exited (code 3)" in failed[0].error
    assert not any(r.error for r in records if r.arm == "off") and len(records) == 8
    run = json.loads((outcome.results_dir / "run.json").read_text())
    assert run["launch"]["servers"][1]["exits"][0]["code"] == 3
    if pairing == "blocks":     # the crashed block's counters are gone: that point is not compared
        entry = next(e for e in run["server_acceptance"] if e["arm"] == "ngram-k4")
        assert entry["blocks_unread"] >= 1 and "requests_agree" not in entry
    assert "The server of ngram-k4 exited mid-run (exit code 3" in outcome.report.summary_md.read_text()


def test_on_server_exit_stop_keeps_what_finished(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("FAKE_ENGINE_CRASH_AFTER", "2")
    monkeypatch.setenv("FAKE_ENGINE_CRASH_SPEC", "1")
    outcome = evaluate(run_config(tmp_path, concurrency="1", round_size=2), argv=[],
                       launch=settings(pairing="side-by-side", on_server_exit="stop"))
    assert outcome.stopped == "the server of arm ngram-k4 exited (code 3); stopped (--on-server-exit stop)"
    assert any(not r.warmup and not r.error for r in read_records(outcome.results_dir))


def test_a_signal_during_stop_kills_at_once_instead_of_abandoning(tmp_path, fake, monkeypatch):
    """A server that ignores SIGTERM; a Ctrl-C while stop_all() waits for it: SIGKILL, no exception."""
    monkeypatch.setenv("FAKE_ENGINE_IGNORE_TERM", "1")
    monkeypatch.setattr(launch_server, "STOP_GRACE", 10 * DEADLINE)
    arm = parse_engine_methods("off", "vllm", 4)[0]
    server = LaunchedServer(build_command("vllm", FAKE, "/m", arm, free_port()), tmp_path / "off.log")
    server.start()
    wait_for(lambda: len(pids(fake)) == 2, "pid files")

    def interrupt_once_terminated():
        wait_for(lambda: list(fake.glob("*.term")), "SIGTERM noted by the server")
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_terminated, daemon=True).start()
    stop_all()
    assert not any(alive(pid) for pid in pids(fake))


def test_start_and_wait_serves_then_stops_with_the_servers_exit_status(tmp_path, fake, monkeypatch):
    """What the benchmarks' and tests' servers (benchmarks/serve_process.py, tests/vllm_process.py) start
    with: ready when it answers, its exit status from stop(); one that never answers is stopped, nothing left."""
    arm = parse_engine_methods("off", "vllm", 4)[0]
    server = LaunchedServer(build_command("vllm", FAKE, "/m", arm, free_port()), tmp_path / "off.log")
    server.start_and_wait(DEADLINE)
    started = pids(fake)
    assert len(started) == 2 and all(alive(pid) for pid in started)
    status = server.stop()
    assert status == -signal.SIGTERM and not any(alive(pid) for pid in started)     # the fake dies of it
    assert server.stop() is None

    monkeypatch.setenv("FAKE_ENGINE_HANG", "1")
    hung = LaunchedServer(build_command("vllm", FAKE, "/m", arm, free_port()), tmp_path / "hung.log")
    with pytest.raises(LaunchError, match="not ready after 1 s"):
        hung.start_and_wait(1.0)
    assert hung.process is None and not any(alive(pid) for pid in pids(fake))


def evaluate_command(output: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "specwise", "evaluate", "--engine", "vllm", "--engine-cmd", FAKE,
            "--model", "/models/hf", "--methods", "off,ngram@4", "--concurrency", "1", "--num-requests", "6",
            "--per-category", "1", "--warmup", "1", "--no-progress", "--settle", "0", "--output", str(output),
            *extra]


@pytest.mark.parametrize("moment,signum", [("start-up", signal.SIGINT), ("measuring", signal.SIGINT),
                                           ("measuring", signal.SIGTERM)])
def test_interrupt_leaves_no_server_and_keeps_results(tmp_path, fake, moment, signum):
    env = dict(os.environ, FAKE_ENGINE_STEP_DELAY="0.05")
    if moment == "start-up":
        env["FAKE_ENGINE_HANG"] = "1"
    output = tmp_path / "results"
    process = subprocess.Popen(evaluate_command(output, "--max-tokens", "32"), cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if moment == "start-up":
            wait_for(lambda: len(pids(fake)) >= 2, "server started")
        else:
            wait_for(lambda: (output / "requests.jsonl").exists() and
                     any(not r.warmup for r in read_records(output)), "measured request")
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=DEADLINE)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("interrupted: finished requests kept in"), stderr
    assert json.loads((output / "run.json").read_text())["interrupted"] is True
    assert not any(alive(pid) for pid in pids(fake))


def test_dry_run_prints_every_command_and_launches_nothing(tmp_path, fake, monkeypatch):
    monkeypatch.delenv(memory.KV_ENV, raising=False)       # the share depends on this machine's memory
    result = subprocess.run(evaluate_command(tmp_path / "results", "--cores", "0/0", "--dry-run"), cwd=ROOT,
                            capture_output=True, text=True, timeout=DEADLINE)
    assert result.returncode == 0, result.stderr
    *lines, note = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["off", "ngram-k4"]
    share = re.match(r"# vLLM for CPU side by side: each of the 2 servers gets VLLM_CPU_KVCACHE_SPACE=(\d+) ", note)
    assert share, note
    assert all(line.split(": ", 1)[1].startswith(f"VLLM_CPU_KVCACHE_SPACE={share.group(1)} "
                                                 "VLLM_CPU_OMP_THREADS_BIND=0 taskset -c 0 ") for line in lines)
    assert "--speculative-config" in lines[1] and not pids(fake) and not (tmp_path / "results").exists()


@pytest.mark.parametrize("user", [{"VLLM_CPU_KVCACHE_SPACE": "7"}, {"engine_args": "--kv-cache-memory-bytes 1000000"},
                                  {"engine_args": "--gpu-memory-utilization=0.3"},
                                  {"engine_cmd": "env VLLM_CPU_KVCACHE_SPACE=4 vllm serve"}])
def test_a_kv_cache_size_the_user_chose_is_kept(user):
    environ = {key: value for key, value in user.items() if key.isupper()}
    env, note = memory.kv_cache_share(2, user.get("engine_cmd"), user.get("engine_args"), environ, available=22 << 30)
    assert env == {} and note is None


def test_each_side_by_side_vllm_cpu_arm_gets_a_share_of_the_available_memory():
    env, note = memory.kv_cache_share(2, "vllm serve", "--enforce-eager", {}, available=int(22.4 * (1 << 30)))
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "5"} and "22.4 GiB available" in note
    assert memory.kv_cache_share(3, None, None, {}, available=2 << 30)[0] == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert memory.kv_cache_share(1, None, None, {}, available=22 << 30) == ({}, None)      # one server alone


def test_side_by_side_launches_and_reports_the_kv_cache_share(tmp_path, fake, monkeypatch):
    monkeypatch.delenv(memory.KV_ENV, raising=False)
    monkeypatch.setattr(memory, "available_memory", lambda: 8 << 30)
    outcome = evaluate(run_config(tmp_path, concurrency="1"), argv=[], launch=settings(pairing="side-by-side"))
    launch = json.loads((outcome.results_dir / "run.json").read_text())["launch"]
    assert [server["env"] for server in launch["servers"]] == [{"VLLM_CPU_KVCACHE_SPACE": "2"}] * 2
    assert "VLLM_CPU_KVCACHE_SPACE=2 (GiB of KV cache" in outcome.report.summary_md.read_text()
    blocks = evaluate(run_config(tmp_path, concurrency="1", output=str(tmp_path / "blocks")), argv=[],
                      launch=settings(blocks=2))
    launch = json.loads((blocks.results_dir / "run.json").read_text())["launch"]
    assert launch["kv_cache"] is None and not any(server["env"] for server in launch["servers"])


def test_an_engine_without_per_request_acceptance_is_relaunched_without_it(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("FAKE_ENGINE_OLD", "1")
    outcome = evaluate(run_config(tmp_path, concurrency="1"), argv=[], launch=settings(pairing="side-by-side"))
    run = json.loads((outcome.results_dir / "run.json").read_text())
    ngram = run["launch"]["servers"][1]
    assert ngram["per_request_metrics"] is False and "--per-request-spec-decode-metrics" not in ngram["argv"]
    assert "unrecognized arguments: --per-request-spec-decode-metrics summary" in ngram["per_request_refused"]
    records = [r for r in read_records(outcome.results_dir) if not r.warmup and r.arm == "ngram-k4"]
    assert records and not any(r.error for r in records) and all(r.drafts is None for r in records)
    assert any(entry["arm"] == "ngram-k4" and entry["drafts"] for entry in run["server_acceptance"])
    summary = outcome.report.summary_md.read_text()
    assert "The engine refused per-request acceptance" in summary
    assert "Acceptance of ngram-k4 comes from the server's Prometheus counters" in summary


def test_blocks_share_the_duration(tmp_path, fake, monkeypatch):
    """--duration D in blocks: each block sends for at most D / blocks, so every block runs."""
    monkeypatch.setenv("FAKE_ENGINE_STEP_DELAY", "0.02")
    config = run_config(tmp_path, concurrency="1", num_requests=40, max_tokens=16, duration=1.0)
    outcome = evaluate(config, argv=[], launch=settings(blocks=2))
    measured = [r for r in read_records(outcome.results_dir) if not r.warmup]
    assert {(r.arm, r.round) for r in measured} == {(arm, block) for arm in ("off", "ngram-k4") for block in (0, 1)}


@pytest.mark.parametrize("flags,message", [(dict(pairing="blocks"), "--pairing needs --engine"),
                                           (dict(engine="tgi"), "--engine must be one of vllm, sglang"),
                                           (dict(engine="vllm", blocks=0), "--blocks must be > 0")])
def test_launch_flags_checked_in_one_line(flags, message):
    with pytest.raises(ConfigError, match=message) as error:
        LaunchConfig(**flags)
    assert "\n" not in str(error.value)


def test_sglang_arms_launch_with_the_sglang_flags(tmp_path, fake):
    outcome = evaluate(run_config(tmp_path, concurrency="1"), argv=[],
                       launch=settings(engine="sglang", engine_cmd=FAKE.removesuffix(" serve"), pairing="side-by-side"))
    run = json.loads((outcome.results_dir / "run.json").read_text())
    servers = run["launch"]["servers"]
    assert run["said"] == {"off": {}, "ngram-k4": {}}       # SGLang's limits are not read
    assert servers[0]["argv"][-6:] == ["--model-path", "/models/hf", "--host", "127.0.0.1", "--port",
                                       str(servers[0]["url"].rsplit(":", 1)[1])]
    assert servers[1]["argv"][-4:] == ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5"]
    records = [r for r in read_records(outcome.results_dir) if not r.warmup]
    assert records and not any(r.error for r in records)
    speculative = [r for r in records if r.arm == "ngram-k4"]
    assert all(r.drafts and r.draft_tokens == 4 * r.drafts for r in speculative)     # SGLang's sglext, per request
    assert "Acceptance of ngram-k4 is read from each response" in outcome.report.summary_md.read_text()


def test_an_sglang_without_per_request_details_falls_back_to_its_prometheus_gauges(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("FAKE_ENGINE_OLD", "1")
    outcome = evaluate(run_config(tmp_path, concurrency="1"), argv=[],
                       launch=settings(engine="sglang", engine_cmd=FAKE.removesuffix(" serve"), pairing="side-by-side"))
    records = [r for r in read_records(outcome.results_dir) if not r.warmup and r.arm == "ngram-k4"]
    assert records and all(r.drafts is None for r in records)
    gauges = [e for e in json.loads((outcome.results_dir / "run.json").read_text())["server_acceptance"]
              if e["arm"] == "ngram-k4"]
    assert gauges and gauges[0]["source"] == "sglang" and 0 < gauges[0]["rate"] < 1 and gauges[0]["length"] > 1
    assert "Acceptance of ngram-k4 comes from the server's Prometheus counters" in outcome.report.summary_md.read_text()


def test_a_start_up_error_names_the_engines_root_cause_not_its_last_complaint():
    """vLLM's worker raises first; its engine then logs a generic RuntimeError pointing "above"."""
    log = ["(APIServer pid=1) WARNING 12-05 08:53:58 [system_utils.py:255] Found ulimit of 20000 and failed to "
           "automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors "
           "like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n",
           "(VllmWorker-0 pid=2) ERROR 12-05 08:54:13 [multiproc_executor.py:953] WorkerProc failed to start.",
           "(VllmWorker-0 pid=2) ERROR 12-05 08:54:13 [multiproc_executor.py:953] ValueError: Available memory on "
           "node 0 (21.51/23.54 GiB) on startup is less than desired CPU memory utilization (0.92, 21.66 GiB).",
           "(EngineCore pid=3) ERROR 12-05 08:54:14 [core.py:1510] EngineCore failed to start.",
           "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"]
    assert launch_server.engine_message(log) == ("ValueError: Available memory on node 0 (21.51/23.54 GiB) on startup "
                                                 "is less than desired CPU memory utilization (0.92, 21.66 GiB).")
    # no exception in the log (argparse's refusal): the last line that names an error
    refused = ["usage: api_server.py [-h] ...", "api_server.py: error: unrecognized arguments: --bogus"]
    assert launch_server.engine_message(refused) == refused[-1]
    assert launch_server.engine_message([]) == "(its log is empty)"
