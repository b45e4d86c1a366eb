"""`specwise simulate --validate DIR`: a tiny recorded run replayed on paper; the errors printed
equal those computed here by hand.

The profile makes every step cost 10 ms. The run: concurrency 1, two requests per arm, prompts
of 8 tokens, 3 output tokens each. Predicted, off: a request's prefill step ends at 10 ms (its
first token), two decode steps end at 20 and 30 ms; the second request is sent at 30 ms. So TTFT
10 ms, TPOT (30 - 10) / 2 = 10 ms, 6 tokens in 60 ms = 100 tok/s. ngram-k4: each request's own
counters say its one draft was accepted (p = 1 at position 1, nothing beyond); after the prefill,
max_tokens leaves room for 1 draft, accepted: 2 tokens in one step. TTFT 10 ms, TPOT 5 ms,
6 tokens in 40 ms = 150 tok/s, acceptance 1.0. The median step: measured, the gaps between each
request's two chunks (24 and 22 ms off, 10 and 14 ms ngram-k4); predicted, 10 ms. Request by request
(every predicted request alike: TTFT 10 ms, TPOT 10 ms off and 5 ms ngram-k4): TTFT measured 12, 11, 11,
10 ms, errors -16.7, -9.1, -9.1, 0%, 3 of 4 within 10%; TPOT measured 12, 11, 5, 7 ms, errors -16.7,
-9.1, 0, -28.6%, 2 of 4 within 10%.
"""

import json

import numpy as np
import pytest

from specwise.bench.report.recommend import recommend
from specwise.bench.report.summary import summarize
from specwise.bench.results import RequestRecord, read_records, read_run_info
from specwise.calc.deployment import Deployment, DeploymentConfig
from specwise.cli import main
from specwise.engine.cost.step_profile import ProfileCost
from specwise.sim.simulator import SimServerConfig
from specwise.sim.validate import (Validation, compare, measured_workload, plan_positions, report, server_from_run,
                                   session_turns, validate, verdict_lines)
from specwise.sim.validation_plot import validation_figure

ENGINE = {"max_num_seqs": 8, "max_num_batched_tokens": 64, "block_size": 4, "num_kv_blocks": 256,
          "max_model_len": 512}
# (arm, send, ttft, e2e): measured
MEASURED = [("off", 0.000, 0.012, 0.036), ("off", 0.040, 0.011, 0.033),
            ("ngram-k4", 0.200, 0.011, 0.021), ("ngram-k4", 0.225, 0.010, 0.024)]


def recorded_run(path):
    lines = []
    for index, (arm, send, ttft, e2e) in enumerate(MEASURED):
        record = RequestRecord(arm=arm, method=arm.partition("-")[0], load_kind="concurrency", load_value=1,
                               category="chat", request_id=f"q{index % 2}", prompt_tokens=8, output_tokens=3,
                               send_time=send, ttft=ttft, e2e=e2e, chunk_times=[ttft, e2e], chunk_tokens=[1, 2])
        if arm != "off":
            record.drafts, record.draft_tokens, record.accepted_tokens = 1, 1, 1
            record.accepted_per_position = [1, 0, 0, 0]
        lines.append(record.to_json())
    (path / "requests.jsonl").write_text("\n".join(lines) + "\n")
    arms = [{"name": "off", "method": "off", "spec": None, "k": 0},
            {"name": "ngram-k4", "method": "ngram", "spec": "ngram", "k": 4}]
    (path / "run.json").write_text(json.dumps({"tool": "evaluate", "arms": arms, "baseline": "off",
                                               "loads": [{"kind": "concurrency", "value": 1}], "engine": ENGINE}))
    profile = {"format": "specwise-step-profile", "version": 1, "batch_sizes": [1, 2], "tokens_per_seq": [1, 2],
               "context_lens": [0, 1], "seconds": np.full((2, 2, 2), 0.010).tolist()}
    (path / "profile.json").write_text(json.dumps(profile))


def hand_errors() -> dict[str, dict[str, float]]:
    """predicted / measured - 1 per arm and metric, from MEASURED and the predictions above."""
    def measured(arm):
        rows = [row for row in MEASURED if row[0] == arm]
        ttft = np.mean([t for _, _, t, _ in rows])
        tpot = np.mean([(e - t) / 2 for _, _, t, e in rows])
        window = max(s + e for _, s, _, e in rows) - min(s for _, s, _, _ in rows)
        return ttft, tpot, 6 / window
    predicted = {"off": (0.010, 0.010, 100.0), "ngram-k4": (0.010, 0.005, 150.0)}
    errors = {arm: dict(zip(("ttft", "tpot", "throughput"), (p / m - 1 for p, m in zip(predicted[arm], measured(arm)))))
              for arm in predicted}
    for arm in predicted:
        errors[arm]["step"] = 0.010 / np.median([e - t for a, _, t, e in MEASURED if a == arm]) - 1
    return errors


def hand_request_errors() -> dict[str, list[float]]:
    """predicted / measured - 1 of each request (in MEASURED's order), TTFT and TPOT."""
    predicted_tpot = {"off": 0.010, "ngram-k4": 0.005}
    return {"ttft": [0.010 / t - 1 for _, _, t, _ in MEASURED],
            "tpot": [predicted_tpot[arm] / ((e - t) / 2) - 1 for arm, _, t, e in MEASURED]}


def test_validate_prints_the_errors_computed_by_hand(tmp_path, capsys):
    recorded_run(tmp_path)
    assert main(["simulate", "--validate", str(tmp_path), "--profile", str(tmp_path / "profile.json"),
                 "--output", str(tmp_path / "predicted")]) == 0
    out = capsys.readouterr().out
    errors = hand_errors()
    assert errors["off"]["ttft"] == pytest.approx(0.010 / 0.0115 - 1)        # -13.0%
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("off ", "ngram-k4 "))}
    for arm, by_metric in errors.items():
        for key in ("ttft", "tpot", "step", "throughput"):
            assert f"{by_metric[key]:+.1%}" in rows[arm].split(), (arm, key, rows[arm])
    assert "1.000" in rows["ngram-k4"].split() and "+0.0%" in rows["ngram-k4"].split()     # acceptance 1 and 1
    assert errors["off"]["step"] == pytest.approx(0.010 / 0.023 - 1)        # -56.5%
    for name, key in (("TTFT", "ttft"), ("TPOT", "tpot"), ("step", "step"), ("tok/s", "throughput")):
        values = [abs(errors[arm][key]) for arm in errors]
        assert f"{name}: median |error| {np.median(values):.1%}, worst {max(values):.1%} over 2 points" in out
    assert "verdicts: 0 of 0 agree" in out            # 2 requests decide nothing
    assert (tmp_path / "predicted" / "requests.jsonl").read_text().count("\n") == 4
    requests = hand_request_errors()
    assert requests["tpot"] == pytest.approx([0.010 / 0.012 - 1, 0.010 / 0.011 - 1, 0.0, 0.005 / 0.007 - 1])
    within = [f"{name} within 10% for {sum(abs(e) <= 0.10 for e in requests[key])} of 4 "
              f"(median |error| {np.median(np.abs(requests[key])):.1%})"
              for name, key in (("TTFT", "ttft"), ("TPOT", "tpot"))]
    assert within == ["TTFT within 10% for 3 of 4 (median |error| 9.1%)",
                      "TPOT within 10% for 2 of 4 (median |error| 12.9%)"]
    assert "per request: " + ", ".join(within) in out


def test_a_servers_run_is_replayed_with_the_limits_its_server_said(tmp_path, capsys):
    """A run against servers (evaluate --engine or --endpoint: no "engine" in run.json) is replayed with what the
    baseline's server said of itself (run.json "said"). Said a budget of 4 tokens a step, the 8-token prompts
    prefill in two 10 ms steps: predicted TTFT 20 ms. Where the server said only its KV cache (vLLM, on
    /metrics), the rest are the flags', and a line names them."""
    recorded_run(tmp_path)
    run = json.loads((tmp_path / "run.json").read_text())
    del run["engine"]
    said = {"max_num_seqs": 8, "max_num_batched_tokens": 4, "block_size": 4, "kv_cache_tokens": 1024}
    run["said"] = {"off": said, "ngram-k4": said}
    (tmp_path / "run.json").write_text(json.dumps(run))
    assert main(["simulate", "--validate", str(tmp_path), "--profile", str(tmp_path / "profile.json")]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("off "))
    assert row.split()[2:5] == ["11.5ms", "20.0ms", f"{0.020 / 0.0115 - 1:+.1%}"]     # TTFT measured, predicted
    assert "does not say" not in out

    deployment = Deployment.from_config(DeploymentConfig())
    vllm = {"baseline": "off", "said": {"off": {"block_size": 128, "kv_cache_tokens": 93184}}}
    server, capacity, _, note = server_from_run(vllm, SimServerConfig(), deployment)
    assert (server.block_size, capacity, server.max_num_seqs, server.max_num_batched_tokens) == (128, 93184, 256, 8192)
    assert note == ("the run does not say its server's max_num_seqs, max_num_batched_tokens: replayed with "
                    "--max-num-seqs 256, --max-num-batched-tokens 8192")
    flags = SimServerConfig(max_num_seqs=128, max_num_batched_tokens=2048, kv_cache_tokens=5000)
    server, capacity, _, note = server_from_run(vllm, flags, deployment)     # a KV cache given wins
    assert (server.max_num_seqs, server.max_num_batched_tokens, capacity) == (128, 2048, 5000) and "256" not in note


def test_two_replays_compare_as_a_measurement_and_its_replay_do(tmp_path):
    """benchmarks/validate_simulator.py holds one sweep's replay against another's: compare() takes any
    two record sets of the run's points, the first's figures under the first's head."""
    recorded_run(tmp_path)
    assert main(["simulate", "--validate", str(tmp_path), "--profile", str(tmp_path / "profile.json"),
                 "--output", str(tmp_path / "predicted")]) == 0
    replay = read_records(tmp_path / "predicted")
    points = compare(read_records(tmp_path), replay, read_run_info(tmp_path))
    errors = hand_errors()
    assert {p.arm: p.error("tpot") for p in points} == pytest.approx({arm: errors[arm]["tpot"] for arm in errors})
    against_itself = compare(replay, replay, read_run_info(tmp_path))
    assert all(p.error(key) == 0 for p in against_itself for key in ("ttft", "tpot", "step", "throughput"))
    out = report(Validation(against_itself), ("sw1", "sw2"), decided_by="sw1")
    assert "TPOT sw1" in out and "TPOT: median |error| 0.0%, worst 0.0% over 2 points" in out
    assert "agree where sw1 decided one" in out


def test_output_keeps_the_comparison_as_text_json_and_a_plot(tmp_path, capsys):
    """`--output DIR`: validation.txt is what was printed, validation.json holds the errors computed by hand
    and the summary lines' figures, validation.png is a PNG."""
    recorded_run(tmp_path)
    out_dir = tmp_path / "predicted"
    assert main(["simulate", "--validate", str(tmp_path), "--profile", str(tmp_path / "profile.json"),
                 "--output", str(out_dir)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith((out_dir / "validation.txt").read_text())
    assert f"plotted in {out_dir / 'validation.png'}" in printed
    saved = json.loads((out_dir / "validation.json").read_text())
    errors = hand_errors()
    by_arm = {point["arm"]: point for point in saved["points"]}
    assert set(by_arm) == {"off", "ngram-k4"}
    for arm, by_metric in errors.items():
        assert by_arm[arm]["load_kind"] == "concurrency" and by_arm[arm]["load_value"] == 1
        assert {key: by_arm[arm]["error"][key] for key in by_metric} == pytest.approx(by_metric)
    assert by_arm["ngram-k4"]["measured"]["acceptance"] == by_arm["ngram-k4"]["predicted"]["acceptance"] == 1.0
    assert by_arm["off"]["error"]["acceptance"] is None
    tpot = [abs(errors[arm]["tpot"]) for arm in errors]
    assert saved["errors"]["tpot"] == pytest.approx({"median_abs_error": np.median(tpot), "worst_abs_error": max(tpot),
                                                     "points": 2})
    assert "verdicts: 0 of 0 agree where the measurement decided one (1 points where it can't tell)" in printed
    assert saved["verdicts"] == {"agree": 0, "decided": 0, "cant_tell": 1} and saved["not_replayed"] == {}
    for key, errors in hand_request_errors().items():
        assert saved["request_errors"][key] == pytest.approx(
            {"within": 0.10, "count_within": sum(abs(e) <= 0.10 for e in errors), "requests": 4,
             "median_abs_error": np.median(np.abs(errors))})
    assert by_arm["ngram-k4"]["verdict"]["measured"] == "can't tell" and by_arm["off"]["verdict"]["measured"] is None
    assert (out_dir / "validation.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_a_decided_verdict_says_what_it_stands_on():
    """Six requests an arm, n-gram's TPOT half the baseline's: "pays" on both sides of a run held against
    itself, and its line carries the report's own speedup, throughput ratio and intervals."""
    records = []
    for index in range(6):
        for arm, tpot in (("off", 0.020 + 0.001 * index), ("ngram-k4", 0.010 + 0.0005 * index)):
            records.append(RequestRecord(arm=arm, method=arm.partition("-")[0], load_kind="concurrency", load_value=1,
                                         category="chat", request_id=f"q{index}", prompt_tokens=8, output_tokens=11,
                                         send_time=index, ttft=0.010, e2e=0.010 + 10 * tpot,
                                         chunk_times=[0.010 + step * tpot for step in range(11)], chunk_tokens=[1] * 11))
    run = {"tool": "evaluate", "baseline": "off", "arms": [{"name": "off", "method": "off", "k": 0},
                                                           {"name": "ngram-k4", "method": "ngram", "k": 4}],
           "loads": [{"kind": "concurrency", "value": 1}]}
    point = next(p for p in compare(records, records, run) if p.arm == "ngram-k4")
    verdict = recommend(summarize(records, run)).verdicts[0]
    assert point.verdicts == ("pays", "pays") and point.speedups[0] == point.speedups[1]
    measured = point.speedups[0]
    assert (measured.speedup, measured.interval, measured.throughput, measured.throughput_interval) == (
        verdict.speedup[1], verdict.intervals[1], verdict.throughput_ratio[1], verdict.throughput_intervals[1])
    assert measured.interval[0] >= 1.05 and measured.speedup == pytest.approx(np.mean([20 + i for i in range(6)])
                                                                             / np.mean([10 + i / 2 for i in range(6)]))
    line = f"ngram-k4 c=1: meas pays at {measured.text()}; pred pays at {measured.text()} (tpot_mean speedup; " \
           f"pays: lower ends >= 1.05x and 0.97x)"
    assert verdict_lines([point]) == ["  " + line] and line in report(Validation([point]))
    assert measured.text().startswith(f"{measured.speedup:.2f}x [{measured.interval[0]:.2f}, ")
    assert Validation([point]).to_json()["points"][0]["speedup"]["measured"]["interval"] == measured.interval


def test_the_plot_draws_each_arms_measured_and_predicted_figures_and_errors(tmp_path):
    """validation.png's figure: per metric a panel of values (measured dots, predicted crosses, in ms for
    times) and below it one of errors; each line's points are the validation's own."""
    recorded_run(tmp_path)
    cost = ProfileCost.load(tmp_path / "profile.json")
    deployment = Deployment.from_config(DeploymentConfig(model="smollm2-135m", gpu="h100-sxm"))
    validation = validate(tmp_path, cost, deployment, SimServerConfig())
    figure = validation_figure(validation)
    panels = ["mean TTFT (ms)", "mean TPOT (ms)", "median step (ms)", "output tokens/s", "acceptance rate"]
    values, errors = figure.axes[0::2], figure.axes[1::2]
    assert [axes.get_ylabel() for axes in values] == panels
    for axes, (key, scale) in zip(values, (("ttft", 1e3), ("tpot", 1e3), ("step", 1e3), ("throughput", 1),
                                           ("acceptance", 1))):
        lines = {line.get_label(): line for line in axes.get_lines()}
        for point in validation.points:
            for side, marker in (("measured", "o"), ("predicted", "x")):
                figure_value = getattr(point, side).get(key)
                label = f"{point.arm} {side}"
                if figure_value is None:
                    assert label not in lines
                    continue
                assert lines[label].get_marker() == marker
                assert list(lines[label].get_xdata()) == [1]
                assert list(lines[label].get_ydata()) == pytest.approx([figure_value * scale])
    tpot_errors = {line.get_label(): line.get_ydata()[0] for line in errors[1].get_lines() if line.get_label() in
                   ("off", "ngram-k4")}
    assert tpot_errors == pytest.approx({arm: hand_errors()[arm]["tpot"] for arm in ("off", "ngram-k4")})
    worst = max(abs(hand_errors()[arm]["tpot"]) for arm in ("off", "ngram-k4"))
    assert f"worst {worst:.1%} (2 points)" in errors[1].get_title()


def test_validate_says_which_arms_it_cannot_replay(tmp_path, capsys):
    recorded_run(tmp_path)
    run = json.loads((tmp_path / "run.json").read_text())
    run["arms"].append({"name": "eagle-k4", "method": "eagle", "spec": "eagle", "k": 4})
    (tmp_path / "run.json").write_text(json.dumps(run))
    assert main(["simulate", "--validate", str(tmp_path), "--profile", str(tmp_path / "profile.json")]) == 0
    assert "not replayed: eagle-k4 (drafting by eagle costs forwards the profile does not hold)" in \
        capsys.readouterr().out


def test_validate_refuses_a_directory_without_results(tmp_path, capsys):
    assert main(["simulate", "--validate", str(tmp_path)]) != 0
    assert "no such file" in capsys.readouterr().err


def test_an_endpoint_arms_k_comes_from_its_requests_counters(tmp_path, capsys):
    """An endpoint arm (`--endpoint ngram-k4=URL`) has no k in run.json: its requests' per-position
    counters (4 positions) give it, and the replay is the one computed by hand above."""
    recorded_run(tmp_path)
    run = json.loads((tmp_path / "run.json").read_text())
    run["arms"][1] |= {"spec": None, "k": None}
    (tmp_path / "run.json").write_text(json.dumps(run))
    assert main(["simulate", "--validate", str(tmp_path), "--profile", str(tmp_path / "profile.json")]) == 0
    out = capsys.readouterr().out
    assert "not replayed" not in out
    row = next(line for line in out.splitlines() if line.startswith("ngram-k4 "))
    assert f"{hand_errors()['ngram-k4']['tpot']:+.1%}" in row.split()


def test_session_turns_come_from_the_measured_workload():
    turns = session_turns(measured_workload({"config": {"workload": "suite"}}))
    assert turns["agentic-sql-revenue-t1"] == "agentic-sql-revenue-t0"
    assert turns["agentic-sql-revenue-t2"] == "agentic-sql-revenue-t1" and "agentic-sql-revenue-t0" not in turns
    assert measured_workload({"config": {"workload": "/no/such/file.jsonl"}}) == []
    assert session_turns(measured_workload({})) != {}      # no config: evaluate's default workload, the suite


def test_plan_positions_are_the_order_evaluate_sends_in():
    """The measured run's workload read again in evaluate's own order (bench/load/plan.build_plan), with
    the run's seed."""
    from specwise.bench.load.config import LoadConfig
    from specwise.bench.load.plan import build_plan
    planned = [r.request_id for r in build_plan(LoadConfig(seed=3)).workload]
    positions = plan_positions(measured_workload({"config": {"workload": "suite", "seed": 3, "order": "seeded"}}))
    assert sorted(positions, key=positions.get) == planned
    assert plan_positions(measured_workload({"config": {"workload": "/no/such/file.jsonl"}})) == {}


def test_a_workload_whose_ids_repeat_has_no_plan_positions(tmp_path):
    """Two lines with one id: which record took which place cannot be told, so the replay keeps the send order."""
    run = {"config": {"workload": str(tmp_path / "w.jsonl"), "order": "file"}}
    (tmp_path / "w.jsonl").write_text('{"prompt": "a", "id": "x"}\n{"prompt": "b", "id": "y"}\n')
    assert plan_positions(measured_workload(run)) == {"x": 0, "y": 1}
    (tmp_path / "w.jsonl").write_text('{"prompt": "a", "id": "x"}\n{"prompt": "b", "id": "x"}\n')
    assert plan_positions(measured_workload(run)) == {}


def test_a_closed_loop_is_replayed_in_the_order_its_workers_took_the_requests(tmp_path):
    """Concurrency 3 over a workload file [a-t0, a-t1, b, c] (`--order file`), every step 10 ms: evaluate's
    first worker sends a-t0, the second holds a-t1 until a-t0 ends, the third sends b; a-t0 (3 tokens) ends
    at 30 ms and a-t1 goes out; b (2 tokens, prefilled in the second step: an idle engine starts on a-t0
    alone) ends then too and its worker sends c. Sent in that order (a-t0, b, c, a-t1), c would go out at 0
    in the replay; taken in the plan's order it goes out when b ends."""
    lines = [{"messages": [{"role": "user", "content": "q0"}], "id": "a-t0", "session": "a", "turn": 0},
             {"messages": [{"role": "user", "content": "q0"}, {"role": "assistant", "content": "r0"},
                           {"role": "user", "content": "q1"}], "id": "a-t1", "session": "a", "turn": 1},
             {"prompt": "b", "id": "b"}, {"prompt": "c", "id": "c"}]
    (tmp_path / "workload.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    # id: (send, its chunks' times from the send); a-t1 and c go out together, a-t1 first (its worker was first)
    measured = {"a-t0": (0.0, [0.01, 0.02, 0.03]), "b": (0.0, [0.02, 0.03]), "c": (0.03, [0.02, 0.03, 0.04]),
                "a-t1": (0.03, [0.01, 0.02, 0.03])}
    records = [RequestRecord(arm="off", method="off", load_kind="concurrency", load_value=3, category="custom",
                             request_id=rid, prompt_tokens=8, output_tokens=len(times), send_time=send,
                             ttft=times[0], e2e=times[-1], chunk_times=times, chunk_tokens=[1] * len(times))
               for rid, (send, times) in measured.items()]
    (tmp_path / "requests.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
    config = {"workload": str(tmp_path / "workload.jsonl"), "order": "file", "seed": 0}
    (tmp_path / "run.json").write_text(json.dumps({
        "tool": "evaluate", "arms": [{"name": "off", "method": "off", "spec": None, "k": 0}], "baseline": "off",
        "loads": [{"kind": "concurrency", "value": 3}], "engine": ENGINE, "config": config}))
    cost = ProfileCost([1, 2], [1, 2], [0, 1], np.full((2, 2, 2), 0.010))
    deployment = Deployment.from_config(DeploymentConfig(model="smollm2-135m", gpu="h100-sxm"))
    validation = validate(tmp_path, cost, deployment, SimServerConfig())
    sends = {r.request_id: r.send_time for r in validation.predicted_records}
    assert sends == pytest.approx({"a-t0": 0.0, "b": 0.0, "c": 0.03, "a-t1": 0.03})
    assert all(p.error("throughput") == pytest.approx(0.0) for p in validation.points)   # the same window


def drift_run(path, waves: list[dict] | None):
    """The plain arm alone at c=1: two requests of 100 and 300 prompt tokens, each streaming three tokens a
    chunk apart (35 ms, then 37 ms), and a linear profile (30 ms + 1 ms a token + 10 us a KV token) whose
    sweep, where given, recorded `waves`."""
    lines = [RequestRecord(arm="off", method="off", load_kind="concurrency", load_value=1, category="chat",
                           request_id=f"q{i}", prompt_tokens=prompt, output_tokens=3, send_time=send, ttft=0.05,
                           e2e=0.05 + 2 * gap, chunk_times=[0.05, 0.05 + gap, 0.05 + 2 * gap],
                           chunk_tokens=[1, 1, 1]).to_json()
             for i, (prompt, send, gap) in enumerate(((100, 0.0, 0.035), (300, 0.2, 0.037)))]
    (path / "requests.jsonl").write_text("\n".join(lines) + "\n")
    (path / "run.json").write_text(json.dumps({"tool": "evaluate", "arms": [{"name": "off", "method": "off"}],
                                               "baseline": "off", "loads": [{"kind": "concurrency", "value": 1}],
                                               "engine": ENGINE}))
    profile = {"format": "specwise-step-profile", "version": 1,
               "linear": {"fixed_s": 0.030, "per_token_s": 0.001, "per_kv_token_s": 1e-5}}
    if waves is not None:
        profile["calibration"] = {"waves": waves}
    (path / "profile.json").write_text(json.dumps(profile))


def test_validate_says_how_far_the_server_moved_between_the_sweep_and_the_run(tmp_path, capsys):
    """The run's batch-1 step: the median of its gaps (35, 35, 37, 37 ms) is 36 ms, over the contexts those
    gaps read (100, 101, 300, 301: 200.5 tokens). The sweep's batch-1 waves, 32.2 ms over 50 tokens and 34.0
    over 250, brought to 200.5 tokens at 10 us a token: 33.705 and 33.505, mean 33.605 ms. The fit there: 30 + 1
    + 2.005 = 33.005 ms. The server moved 36 / 33.605 - 1 = +7.1%; the fit is 33.005 / 33.605 - 1 = -1.8% from
    the sweep, -8.3% from the run. A wave of another batch size or endpoint, or one with errors, is not one."""
    waves = [{"endpoint": "off", "batch_size": 1, "errors": 0, "kv_tokens": 50.0, "decode_seconds": 0.0322},
             {"endpoint": "off", "batch_size": 1, "errors": 0, "kv_tokens": 250.0, "decode_seconds": 0.0340},
             {"endpoint": "off", "batch_size": 4, "errors": 0, "kv_tokens": 200.0, "decode_seconds": 0.050},
             {"endpoint": "ngram", "batch_size": 1, "errors": 0, "kv_tokens": 60.0, "decode_seconds": 0.040},
             {"endpoint": "off", "batch_size": 1, "errors": 1, "kv_tokens": 60.0, "decode_seconds": 0.090},
             {"endpoint": "off", "batch_size": 1, "errors": 1, "prompt_tokens": 32}]
    drift_run(tmp_path, waves)
    assert main(["simulate", "--validate", str(tmp_path), "--profile", str(tmp_path / "profile.json")]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line == ("between the sweep and the run: off's batch-1 decode step took 36.0 ms in the run (c=1, the "
                    "median chunk gap, about 200 cached tokens) against 33.6 ms in the sweep (its 2 batch-1 waves, at "
                    "that context): the server moved +7.1%; the fit is -1.8% from the sweep's waves (-8.3% from the run)")


def test_no_drift_line_without_a_sweeps_batch_1_waves(tmp_path, capsys):
    drift_run(tmp_path, None)                        # a linear profile written by hand: no sweep recorded
    assert main(["simulate", "--validate", str(tmp_path), "--profile", str(tmp_path / "profile.json")]) == 0
    assert "between the sweep and the run" not in capsys.readouterr().out
    recorded_run(tmp_path)                           # a grid profile (our engine's calibrate)
    assert main(["simulate", "--validate", str(tmp_path), "--profile", str(tmp_path / "profile.json")]) == 0
    assert "between the sweep and the run" not in capsys.readouterr().out
