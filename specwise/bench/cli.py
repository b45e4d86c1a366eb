"""`specwise evaluate` and `specwise report`."""

import argparse
import sys

from specwise.bench.config import EvaluateConfig
from specwise.bench.launch.config import LaunchConfig
from specwise.bench.report.recommend import DEFAULT_MARGIN, DEFAULT_METRIC, DEFAULT_THROUGHPUT_FLOOR
from specwise.bench.report.summary import PAY_METRICS
from specwise.cli_args import add_dataclass_args, dataclass_from_args
from specwise.config import EngineConfig

ENGINE_EXCLUDE = ("speculative", "seed")     # arms come from --methods; --seed is shared


def register(subparsers) -> None:
    evaluate = subparsers.add_parser(
        "evaluate", help="measure every arm side by side and say where speculation pays",
        description="Run the workload against each arm (no speculation and each drafting method, "
                    "in-process or on OpenAI-compatible endpoints) at each load point; write "
                    "requests.jsonl, summary.json, summary.md and report.html.")
    add_dataclass_args(evaluate, EvaluateConfig)
    launched = evaluate.add_argument_group("launched engine (--engine: one vLLM or SGLang server per --methods arm)")
    add_dataclass_args(launched, LaunchConfig)
    engine = evaluate.add_argument_group("in-process engine (for the --methods arms; --model also for --engine)")
    # --compile unset: the compiled graphs when the compile cache holds them (the forward `specwise serve` runs),
    # else eager, and the start-up line says so
    add_dataclass_args(engine, EngineConfig, exclude=ENGINE_EXCLUDE, defaults={"compile": None})
    evaluate.set_defaults(handler=run_evaluate)

    report = subparsers.add_parser(
        "report", help="re-render the report of a results directory",
        description="Render summary.json, summary.md and report.html from RESULTS "
                    "(written by `specwise evaluate` or `specwise simulate`).")
    report.add_argument("results", help="results directory")
    report.add_argument("--pay-metric", choices=PAY_METRICS, default=None,
                        help=f"latency metric deciding where speculation pays (default: the run's, else {DEFAULT_METRIC})")
    report.add_argument("--margin", type=float, default=None,
                        help=f"latency gain needed to pay (default: the run's, else {DEFAULT_MARGIN})")
    report.add_argument("--throughput-floor", type=float, default=None,
                        help=f"throughput kept vs no speculation (default: the run's, else {DEFAULT_THROUGHPUT_FLOOR})")
    report.set_defaults(handler=run_report)


def run_evaluate(args: argparse.Namespace) -> int:
    from specwise.bench.evaluate import evaluate
    config = dataclass_from_args(EvaluateConfig, args)
    launch = dataclass_from_args(LaunchConfig, args)
    defaults = EngineConfig.__dataclass_fields__             # flags left out are absent from args
    k = getattr(args, "num_speculative_tokens", defaults["num_speculative_tokens"].default)
    settings = launch.settings(getattr(args, "model", None), k) if launch.engine else None
    engine_config = (dataclass_from_args(EngineConfig, args, seed=config.seed)
                     if config.in_process_methods() and settings is None else None)
    outcome = evaluate(config, engine_config, argv=sys.argv[1:], launch=settings)
    if outcome.commands is not None:
        print("\n".join(outcome.commands))
        return 0
    if outcome.stopped:
        kept = "report rendered from them" if outcome.report else "nothing finished yet"
        print(f"specwise: {outcome.stopped}; finished requests kept in {outcome.results_dir} ({kept})",
              file=sys.stderr)
        return 1
    if outcome.interrupted:
        kept = "report rendered from them" if outcome.report else "nothing finished yet"
        print(f"interrupted: finished requests kept in {outcome.results_dir} ({kept}); "
              f"`specwise report {outcome.results_dir}` re-renders it", file=sys.stderr)
        return 130
    _print_report(outcome.report)
    return 0


def run_report(args: argparse.Namespace) -> int:
    from specwise.bench.report.render import render_report
    _print_report(render_report(args.results, args.pay_metric, args.margin, args.throughput_floor))
    return 0


def _print_report(files) -> None:
    for line in files.recommendation_lines:
        print(line)
    print(f"report: {files.report_html}\nsummary: {files.summary_md}, {files.summary_json}")
