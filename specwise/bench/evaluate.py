"""`specwise evaluate`: build the arms and the plan, run them, render the report.

Arms: the in-process --methods (one model load) and the --endpoint URLs, in one run,
compared with the same client and the same requests. Every arm asked for runs: an
endpoint that cannot be reached stops the command before anything is measured.

Launched arms (--engine vllm|sglang): one server per --methods arm, started and stopped by
this run (bench/launch/), paired side by side or in blocks; their commands, versions and
logs are kept in run.json "launch" and servers/<arm>.log. An arm naming our own head
(eagle:DIR, medusa:DIR) is exported to the engine's format first (bench/launch/exports.py,
run.json "launch" "exports").

An interrupted run (Ctrl-C, SIGTERM with launched servers) keeps every finished request;
run.json is marked interrupted and the report is rendered from what finished. No launched
server outlives the command (bench/launch/server.py).
"""

import asyncio
import dataclasses
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from specwise.bench.config import DEFAULT_METHODS, EvaluateConfig
from specwise.bench.launch.exports import check_exports, exported_specs, plan_exports, run_exports
from specwise.bench.launch.pool import LaunchSettings, ServerExited, ServerPool
from specwise.bench.launch.server import LaunchError, interrupt_on_sigterm, stop_all
from specwise.bench.load.arms import ArmSpec, parse_endpoints, parse_engine_methods, parse_methods
from specwise.bench.load.plan import Plan, build_plan
from specwise.bench.load.progress import make_view
from specwise.bench.report.render import ReportFiles, render_report
from specwise.bench.results import read_records, write_run_info
from specwise.bench.load.runner import Runner
from specwise.bench.load.slo import parse_slo
from specwise.bench.inputs.synthetic import synthesize_prompts
from specwise.bench.load.schedule import choose_schedule
from specwise.bench.load.targets.http import HttpTarget, announced, check_endpoint
from specwise.bench.stats.precision import PrecisionCheck
from specwise.bench.load.token_counter import LocalTokenizer
from specwise.config import EngineConfig
from specwise.errors import ConfigError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct (embedded default)"


@dataclass
class Outcome:
    results_dir: Path
    report: ReportFiles | None      # None when interrupted before anything finished
    interrupted: bool = False
    stopped: str | None = None      # why the run stopped early (--on-server-exit stop)
    commands: list[str] | None = None   # --dry-run: what would be launched, nothing run


@dataclass
class Arms:
    specs: list[ArmSpec]
    targets: list
    tokenizer: object | None
    max_model_len: int | None
    model: str
    shutdown: object = None         # called when the run ends (the engine's step thread)
    kernels: dict | None = None     # what the in-process engine runs (LLMEngine.kernels)


def evaluate(config: EvaluateConfig, engine_config: EngineConfig | None = None,
             argv: list[str] | None = None, checkpoint=None, launch: LaunchSettings | None = None) -> Outcome:
    """`checkpoint`: an already loaded model for the in-process arms (tests, notebooks).
    `launch`: the --methods arms are servers this run launches (--engine)."""
    engine_config = engine_config or EngineConfig()
    plan = build_plan(config)
    specs = _arm_specs(config, engine_config, launch)
    baseline = _baseline(config, specs)
    results_dir = _results_dir(config.output)
    pool = None
    if launch is not None:
        exports = plan_exports(specs, launch.engine, results_dir)
        check_exports(exports)
        specs = exported_specs(specs, exports)
        pool = ServerPool(launch, [spec for spec in specs if spec.engine], results_dir)
        if launch.dry_run:
            notes = [f"# {pool.kv_note}"] if pool.kv_note else []
            return Outcome(results_dir, None, commands=[export.text() for export in exports] + [
                f"{name}: {command.text()}" for name, command in pool.commands.items()] + notes)
        for export in exports:
            print(f"specwise: {export.text()}", file=sys.stderr, flush=True)
        run_exports(exports, launch.model)
        pool.info["exports"] = [dataclasses.asdict(export) for export in exports]
    blocks = launch.blocks if pool is not None and pool.pairing == "blocks" else None
    settle = 0.0 if config.settle is None and launch and (launch.cores or launch.devices) else config.settle
    schedule = choose_schedule(config.schedule, specs, config.round_size, settle, blocks)
    headers = _headers(config)
    said = pool.said if pool is not None else {}    # each server's limits as it says them (launched: once up)
    for spec in specs:
        if spec.url is not None:
            asyncio.run(check_endpoint(spec.name, spec.url, headers))
            said[spec.name] = asyncio.run(announced(spec.url, headers)).limits()
    with interrupt_on_sigterm():
        try:
            return _measure(config, engine_config, plan, specs, baseline, results_dir, schedule, headers, argv,
                            checkpoint, pool, said)
        finally:
            stop_all()


def _measure(config, engine_config, plan, specs, baseline, results_dir, schedule, headers, argv, checkpoint,
             pool: ServerPool | None, said: dict[str, dict]) -> Outcome:
    arms = _arms(config, engine_config, specs, checkpoint, headers, pool)
    if config.trace:
        plan.workload = synthesize_prompts(plan.workload, config.trace_category, arms.tokenizer, arms.max_model_len)
        plan.info["clipped"] = sum(1 for r in plan.workload if r.extra.get("clipped"))
    info = _run_info(config, engine_config, plan, arms, baseline, argv)
    info["schedule"] = schedule.to_dict([spec.name for spec in specs])
    info["said"] = said          # launched servers' filled in as they come up
    if pool is not None:
        info["launch"] = pool.info          # updated in place as servers start and exit
    view = make_view(config.progress)
    precision = None if config.precision is None else PrecisionCheck(
        baseline, list(dict.fromkeys([config.pay_metric, "e2e_mean", "output_throughput"])), config.precision,
        config.confidence, config.seed, blocks=schedule.kind == "blocks")
    runner = Runner(plan, arms.targets, results_dir, info, view, config.warmup, config.request_timeout,
                    parse_slo(config.slo), tokenizer=arms.tokenizer, schedule=schedule, precision=precision)
    try:
        asyncio.run(runner.run())
    except KeyboardInterrupt:
        info["interrupted"] = True
        write_run_info(results_dir, info)
        return Outcome(results_dir, _report_what_finished(results_dir), interrupted=True)
    except ServerExited as error:
        info["stopped"] = str(error)
        write_run_info(results_dir, info)
        return Outcome(results_dir, _report_what_finished(results_dir), stopped=str(error))
    except LaunchError as error:
        info["launch_error"] = str(error)
        write_run_info(results_dir, info)
        report = _report_what_finished(results_dir)
        if report is None:          # before anything was measured: the error is the whole story
            raise
        return Outcome(results_dir, report, stopped=str(error))     # a restart in blocks failed
    finally:
        view.close()
        if arms.shutdown is not None:
            arms.shutdown()
    info["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    write_run_info(results_dir, info)
    return Outcome(results_dir, render_report(results_dir))


def _arm_specs(config: EvaluateConfig, engine_config: EngineConfig | None,
               launch: LaunchSettings | None = None) -> list[ArmSpec]:
    """In-process (or launched) arms first, then the endpoints, in the order given; names must differ."""
    methods = config.in_process_methods()
    specs = []
    if launch is not None:
        specs += parse_engine_methods(config.methods or DEFAULT_METHODS, launch.engine, launch.k)
    elif methods:
        specs += parse_methods(methods, (engine_config or EngineConfig()).num_speculative_tokens)
    if config.endpoint:
        specs += parse_endpoints(config.endpoint)
    names = [spec.name for spec in specs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"arm name given twice: {', '.join(twice)} (an --endpoint NAME may not repeat a "
                          "--methods arm; rename the endpoint, e.g. vllm-off=URL)")
    return specs


def _headers(config: EvaluateConfig) -> dict:
    key = config.api_key or os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _arms(config: EvaluateConfig, engine_config: EngineConfig | None, specs: list[ArmSpec], checkpoint,
          headers: dict, pool: ServerPool | None = None) -> Arms:
    """The targets, in the order of `specs`; in-process arms load the model (once)."""
    local = [spec for spec in specs if spec.url is None and spec.engine is None]
    by_name, tokenizer, max_len, shutdown, kernels = {}, None, None, None, None
    model = config.served_model or "served by the endpoints"
    if pool is not None:
        model = f"{pool.settings.model} on {pool.settings.engine}"
        by_name.update((target.name, target) for target in pool.targets(
            api=config.api, model=config.served_model, temperature=config.temperature,
            timeout=config.request_timeout, headers=headers))
    if local:
        from specwise.bench.load.targets.engine import build_engine_targets
        targets, tokenizer, async_engine = build_engine_targets(engine_config or EngineConfig(), local,
                                                                config.temperature, config.seed, checkpoint)
        by_name.update((target.name, target) for target in targets)
        max_len, shutdown = async_engine.engine.max_model_len, async_engine.shutdown
        kernels = async_engine.engine.kernels
        print(f"specwise: engine: {async_engine.engine.kernel_line}{_measured_forward(async_engine.engine)}",
              file=sys.stderr, flush=True)
        model = (engine_config and engine_config.model) or DEFAULT_MODEL_NAME
    if config.tokenizer and tokenizer is None:
        tokenizer = LocalTokenizer(config.tokenizer)
    for spec in specs:
        if spec.url is not None:
            by_name[spec.name] = HttpTarget(name=spec.name, base_url=spec.url, method=spec.method, api=config.api,
                                            model=config.served_model, temperature=config.temperature,
                                            timeout=config.request_timeout, headers=headers)
    return Arms(specs, [by_name[spec.name] for spec in specs], tokenizer, max_len, model, shutdown=shutdown,
                kernels=kernels)


def _measured_forward(engine) -> str:
    """Which forward the in-process arms measure, said against the one `specwise serve` runs by default: its
    compiled graphs once the compile cache holds them (its first start compiles them in the background)."""
    if engine.compiled:
        return " (the forward `specwise serve` runs)"
    if engine.pending_compile is not None:
        return ("; measuring the EAGER engine: the compile cache holds no compiled graphs for these settings yet, "
                "and `specwise serve` runs those once it has compiled them. To measure them: add --compile (it "
                "compiles first, minutes), or run this again after a first `specwise serve`")
    return " (--no-compile: `specwise serve` runs compiled graphs; --compile measures those)"


def _baseline(config: EvaluateConfig, specs: list[ArmSpec]) -> str:
    names = [spec.name for spec in specs]
    if config.baseline is not None:
        if config.baseline not in names:
            raise ConfigError(f"--baseline {config.baseline!r} is not an arm; arms: {', '.join(names)}")
        return config.baseline
    plain = [spec.name for spec in specs if spec.method == "off"]
    return plain[0] if plain else names[0]


def _results_dir(output: str | None) -> Path:
    path = Path(output) if output else Path("specwise-results") / time.strftime("%Y%m%d-%H%M%S")
    if (path / "requests.jsonl").exists():
        raise ConfigError(f"{path} already holds results; choose another --output "
                          f"(or re-render it with `specwise report {path}`)")
    return path


def _run_info(config: EvaluateConfig, engine_config: EngineConfig, plan: Plan, arms: Arms,
              baseline: str, argv: list[str] | None) -> dict:
    in_process = any(spec.url is None and spec.engine is None for spec in arms.specs)
    return {
        "tool": "evaluate", "model": arms.model,
        "machine": machine_description(engine_config if in_process else None),
        "arms": [spec.to_dict() for spec in arms.specs], "baseline": baseline,
        "loads": [dataclasses.asdict(point) for point in plan.loads],
        "slo": parse_slo(config.slo).to_dict(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "argv": _redacted(argv if argv is not None else sys.argv[1:]), "workload": plan.info,
        "warmup": config.warmup, "temperature": config.temperature,
        "criteria": {"pay_metric": config.pay_metric, "margin": config.margin,
                     "throughput_floor": config.throughput_floor, "confidence": config.confidence,
                     "precision": config.precision},
        "engine": dataclasses.asdict(engine_config) if in_process and engine_config else None,
        "kernels": arms.kernels,
        "config": dict(dataclasses.asdict(config), api_key=None),
    }


def _redacted(argv: list[str]) -> list[str]:
    """The command line with the --api-key value blanked out."""
    out = []
    for index, arg in enumerate(argv):
        secret = index > 0 and argv[index - 1] == "--api-key"
        out.append("***" if secret else "--api-key=***" if arg.startswith("--api-key=") else arg)
    return out


def machine_description(engine_config: EngineConfig | None = None) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as file:
            cpu = next((line.split(":", 1)[1].strip() for line in file if line.startswith("model name")), cpu)
    except OSError:
        pass
    device = f", engine device {engine_config.device}" if engine_config else " (the client; endpoints run elsewhere)"
    return f"{platform.node()}: {cpu}, {os.cpu_count()} CPUs{device}"


def _report_what_finished(results_dir: Path) -> ReportFiles | None:
    try:
        if any(not record.warmup for record in read_records(results_dir)):
            return render_report(results_dir)
    except Exception as error:      # the interrupt matters more than a failed partial report
        print(f"specwise: could not render the partial report: {error}", file=sys.stderr)
    return None
