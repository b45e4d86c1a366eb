"""`specwise simulate`: the evaluation, on paper, for any GPU, model and drafter.

Workloads and load points follow `evaluate` (same flags, the same requests per point,
the same arrival times, the same --duration cut-off: bench/load/config.py, plan.py and arrivals.py
decide for both); the results directory has evaluate's format, so `specwise report DIR`
renders it with the same plots and recommendation.
"""

import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from specwise.bench.load.config import LoadConfig, check_positive, help_field
from specwise.bench.load.plan import Plan, build_plan
from specwise.bench.results import read_records, read_run_info
from specwise.calc.arms import OFF, parse_arm
from specwise.calc.cli import add_profile_arg, console, table, target_cost
from specwise.calc.deployment import Deployment, DeploymentConfig
from specwise.cli_args import add_dataclass_args, dataclass_from_args
from specwise.engine.cost.step_profile import profile_token_budget
from specwise.errors import ConfigError
from specwise.sim.drift import run_drift
from specwise.sim.flat import FlatResult, FlatSimulator
from specwise.sim.records import write_results
from specwise.sim.simulator import SimServerConfig, Simulator
from specwise.sim.validate import report, validate, write_predicted
from specwise.sim.validation_plot import validation_png
from specwise.sim.workload import prompt_tokens


@dataclass
class SimulateConfig(LoadConfig):
    arm: list[str] = field(default_factory=list, metadata={
        "help": "a speculation arm, e.g. draft:k=4,alpha=0.8,drafter=llama-3.2-1b (see docs/calculators.md); "
                "'off' is always simulated"})
    prompt_tokens: int | None = help_field("give every request this prompt length, tokens")
    prompt_tokens_from: str | None = help_field(
        "an evaluate results directory: take each request's prompt length as counted there "
        "(default: estimated from the text, 4 characters a token)")
    output_tokens: int | None = help_field("give every request exactly this output length, tokens")
    output_tokens_from: str | None = help_field(
        "an evaluate results directory: give each request the output length it had there (where it stopped, "
        "EOS included; the baseline arm's, else any arm's), capped at its max_tokens")
    output: str | None = help_field("results directory (default: specwise-results/sim-<timestamp>)")
    validate: str | None = help_field(
        "an evaluate results directory: replay its requests, load points and arms on paper (the engine's limits "
        "from its run.json, step costs from --profile) and print measured against predicted, with the errors; "
        "--output then keeps the predicted run and the comparison (validation.txt, .json and a plot, .png)")

    default_concurrency: ClassVar[str] = "1,4,16,64"

    def __post_init__(self):
        super().__post_init__()
        for name in ("prompt_tokens", "output_tokens"):
            check_positive(self, name)


def register(subparsers) -> None:
    parser = subparsers.add_parser("simulate", help="simulate a serving run with and without speculation",
                                   description=__doc__.splitlines()[0])
    for config in (DeploymentConfig, SimServerConfig, SimulateConfig):
        add_dataclass_args(parser, config)
    add_profile_arg(parser)
    parser.set_defaults(handler=run_simulate)


def run_simulate(args, argv: list[str] | None = None) -> int:
    deployment = Deployment.from_config(dataclass_from_args(DeploymentConfig, args))
    server = dataclass_from_args(SimServerConfig, args, **profile_server_defaults(args))
    config = dataclass_from_args(SimulateConfig, args)
    cost = target_cost(args, deployment)
    if config.validate:
        return run_validate(config, cost, deployment, server, args.profile)
    arms = [OFF] + [parse_arm(text, cost, deployment) for text in config.arm if text.strip() != "off"]
    if len({arm.name for arm in arms}) != len(arms):
        raise ConfigError("two arms share a name; add name=... to one of them")
    plan = build_plan(config)
    apply_lengths(plan, config)
    started = time.perf_counter()
    mean_length = sum(prompt_tokens(r)[0] + r.max_tokens for r in plan.workload) / len(plan.workload)
    results = [_simulator(arm, cost, deployment, server, config.seed, mean_length).run(
        plan.requests(point), arm, point, config.burstiness, config.duration)
        for point in plan.loads for arm in arms]
    elapsed = time.perf_counter() - started
    out_dir = Path(config.output) if config.output else Path("specwise-results") / time.strftime("sim-%Y%m%d-%H%M%S")
    run_info = {"model": deployment.model.name, "machine": f"simulated: {cost.description}",
                "arms": [arm.describe() for arm in arms], "baseline": "off",
                "loads": [dataclasses.asdict(point) for point in plan.loads], "slo": {}, "workload": plan.info,
                "argv": list(argv if argv is not None else sys.argv[1:]),
                "simulation": _simulation_info(results, server, elapsed, config),
                "cut_off": _cut_off(results)}
    records = write_results(out_dir, results, run_info)
    print_summary(records, run_info, out_dir, elapsed)
    return 0


def profile_server_defaults(args) -> dict:
    """What the profile knows of the calibrated server, where the command line does not say it: its token
    budget a step (a profile `calibrate --endpoint` wrote), with a line saying so."""
    budget = profile_token_budget(args.profile) if args.profile else None
    if budget is None or getattr(args, "max_num_batched_tokens", None) is not None:
        return {}
    print(f"simulate: the calibrated server takes at most {budget} tokens a step (the profile's; "
          f"--max-num-batched-tokens to say otherwise)")
    return {"max_num_batched_tokens": budget}


def run_validate(config: SimulateConfig, cost, deployment: Deployment, server: SimServerConfig,
                 profile: str | None = None) -> int:
    validation = validate(config.validate, cost, deployment, server, seed=config.seed)
    lines = [f"{config.validate} replayed on paper ({cost.description}); error = predicted / measured - 1",
             report(validation)]
    if drift := run_drift(config.validate, profile, cost):
        lines.append(drift.describe())
    print("\n".join(lines))
    if config.output:
        out = Path(config.output)
        write_predicted(out, validation, read_run_info(config.validate))
        (out / "validation.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (out / "validation.json").write_text(json.dumps(validation.to_json(), indent=1) + "\n", encoding="utf-8")
        plotted = ""
        if validation.points:
            (out / "validation.png").write_bytes(validation_png(validation))
            plotted = f", plotted in {out / 'validation.png'}"
        print(f"predicted run in {out} (render: specwise report {out}); the comparison in {out / 'validation.txt'} "
              f"and {out / 'validation.json'}{plotted}")
    return 0


def _simulator(arm, cost, deployment: Deployment, server: SimServerConfig, seed: int,
               mean_length: float) -> Simulator | FlatSimulator:
    """A drafter model's weights and KV share the memory: the draft arm holds fewer tokens."""
    budget = arm.draft.kv_budget
    fraction = 1.0 if budget is None else min(1.0, budget / mean_length)
    plan = deployment.memory_plan(arm.drafter, fraction)
    if server.kv_cache_tokens is None and not plan.fits:
        raise ConfigError(f"arm {arm.name}: the weights need {plan.weight_bytes_per_gpu / 2**30:.1f} GiB per GPU, "
                          f"{plan.usable_bytes_per_gpu / 2**30:.1f} GiB are usable; raise --tp or use a smaller "
                          f"--weight-dtype")
    capacity = server.kv_cache_tokens or plan.kv_capacity_tokens
    if server.scheduler == "flat":
        return FlatSimulator(cost, server, capacity, seed=seed)
    return Simulator(cost, server, capacity, seed=seed)


def apply_lengths(plan: Plan, config: SimulateConfig) -> None:
    """The length overrides, applied to the workload evaluate would send (after its --max-tokens cap)."""
    counted = _counted_prompt_tokens(config.prompt_tokens_from) if config.prompt_tokens_from else {}
    lengths = _measured_output_tokens(config.output_tokens_from) if config.output_tokens_from else {}
    for request in plan.workload:
        if request.prompt_tokens is None:
            request.prompt_tokens = counted.get(request.request_id)
        if request.request_id in lengths:
            request.max_tokens = min(request.max_tokens, lengths[request.request_id])
        if config.prompt_tokens is not None:
            request.prompt_tokens = config.prompt_tokens
        if config.output_tokens is not None:
            request.max_tokens = config.output_tokens
    plan.info["prompt_tokens_estimated"] = sum(1 for request in plan.workload if prompt_tokens(request)[1])


def _counted_prompt_tokens(results_dir: str) -> dict[str, int]:
    """request id -> prompt tokens as the target counted them (chat template included); ids
    there may carry evaluate's warm-up prefix or repeat suffix ("warmup:chat-01", "chat-01#2")."""
    counted = {record.request_id.removeprefix("warmup:").partition("#")[0]: record.prompt_tokens
               for record in read_records(results_dir) if record.prompt_tokens > 0}
    if not counted:
        raise ConfigError(f"--prompt-tokens-from {results_dir}: no request there has a prompt token count")
    return counted


def _measured_output_tokens(results_dir: str) -> dict[str, int]:
    """request id -> output tokens measured there: the baseline arm's where it has the request."""
    records = [r for r in read_records(results_dir) if not r.error and r.output_tokens > 0 and not r.warmup]
    if not records:
        raise ConfigError(f"--output-tokens-from {results_dir}: no completed request there")
    baseline = read_run_info(results_dir).get("baseline", "off") if Path(results_dir, "run.json").exists() else "off"
    lengths: dict[str, int] = {}
    for record in sorted(records, key=lambda r: r.arm == baseline):        # the baseline's last: it wins
        lengths[record.request_id.partition("#")[0]] = record.output_tokens
    return lengths


def _cut_off(results) -> list[dict]:
    """run.json "cut_off" as evaluate writes it: requests still running at the time limit."""
    entries = []
    for result in results:
        if isinstance(result, FlatResult):
            if result.cut_off:
                entries.append({"requests": result.cut_off, "arm": result.arm, "load_kind": result.load.kind,
                                "load_value": result.load.value})
            continue
        state = result.state
        cut = int(np.sum(~np.isnan(state.send) & ~state.recorded()))
        if cut:
            entries.append({"requests": cut, "arm": result.arm, "load_kind": result.load.kind,
                            "load_value": result.load.value})
    return entries


def _simulation_info(results, server: SimServerConfig, elapsed: float, config: SimulateConfig) -> dict:
    notes = ["every request generates exactly its max_tokens (a measured or trace length; EOS is not drawn)"]
    if server.scheduler == "flat":
        notes.append("server modelled as today's engines (ours, vLLM V1): each step runs the decodes with their "
                     "drafts, then prompt chunks within max_num_batched_tokens, scheduled by specwise's own "
                     "engine scheduler")
        runs = [{"arm": r.arm, "load_kind": r.load.kind, "load_value": r.load.value, "kv_blocks": r.kv_blocks,
                 "peak_kv_blocks": r.peak_kv_blocks, "preemptions": r.preemptions, "steps": r.steps}
                for r in results]
    else:
        notes.append("server modelled as vLLM V0: prefill steps of whole prompts, then decode steps")
        runs = [{"arm": r.arm, "load_kind": r.load.kind, "load_value": r.load.value,
                 "kv_blocks": r.kv_blocks, "peak_kv_blocks": r.peak_kv_blocks, "preemptions": r.preemptions,
                 "decode_steps": r.decode_steps, "prefill_steps": r.prefill_steps,
                 "mean_requests_in_system": r.occupancy / r.duration if r.duration else 0.0}
                for r in results]
    return {"server": dataclasses.asdict(server), "seed": config.seed, "wall_seconds": round(elapsed, 3),
            "notes": notes, "runs": runs}


def print_summary(records, run_info: dict, out_dir: Path, elapsed: float) -> None:
    """A compact table from the records' scalar fields (`specwise report` computes everything)."""
    points = point_figures(records)
    out = table(run_info["machine"], "arm", "load", "tok/s", "TTFT", "TPOT", "e2e p50", "accept", "TPOT x",
                "tok/s x")
    out.columns[0].no_wrap = True
    for (arm, kind, value), figures in points.items():
        base = points.get(("off", kind, value))
        gains = (None, None) if base is None or arm == "off" else (
            base["tpot"] / figures["tpot"] if figures["tpot"] else None,
            figures["throughput"] / base["throughput"] if base["throughput"] else None)
        out.add_row(arm, _load_label(kind, value), _num(figures["throughput"], "{:.0f}"),
                    _num(figures["ttft"], "{:.0f}ms", 1e3), _num(figures["tpot"], "{:.1f}ms", 1e3),
                    _num(figures["e2e_p50"], "{:.2f}s"), _num(figures["acceptance"], "{:.2f}"),
                    _num(gains[0], "{:.2f}"), _num(gains[1], "{:.2f}"))
    errors = sum(1 for record in records if record.error)
    view = console()
    view.print(out)
    view.print("TTFT and TPOT are means; 'x' columns are gains against off (> 1: the arm is better); "
               "acceptance = accepted / drafted.")
    if errors:
        view.print(f"{errors} request(s) could not be served (too long for the KV cache): see requests.jsonl")
    view.print(f"simulated in {elapsed:.1f} s; results in {out_dir} (render: specwise report {out_dir})")


def point_figures(records) -> dict:
    """(arm, load kind, load value) -> throughput, mean TTFT and TPOT, median e2e, acceptance rate,
    with evaluate's definitions (TPOT = (e2e - TTFT) / (output_tokens - 1), per request)."""
    groups: dict[tuple, list] = {}
    for record in records:
        groups.setdefault((record.arm, record.load_kind, record.load_value), []).append(record)
    points = {}
    for key, group in groups.items():
        done = [r for r in group if not r.error]
        window = max(r.send_time + r.e2e for r in done) - min(r.send_time for r in done) if done else 0.0
        tpots = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
        drafted = sum(r.draft_tokens or 0 for r in done)
        points[key] = {
            "throughput": sum(r.output_tokens for r in done) / window if window else None,
            "ttft": float(np.mean([r.ttft for r in done])) if done else None,
            "tpot": float(np.mean(tpots)) if tpots else None,
            "e2e_p50": float(np.median([r.e2e for r in done])) if done else None,
            "acceptance": sum(r.accepted_tokens or 0 for r in done) / drafted if drafted else None}
    return points


def _load_label(kind: str, value: float) -> str:
    return {"concurrency": f"c={value:g}", "rate": f"{value:g}/s"}.get(kind, f"trace x{value:g}")


def _num(value, pattern: str, scale: float = 1.0) -> str:
    return "-" if value is None else pattern.format(value * scale)
