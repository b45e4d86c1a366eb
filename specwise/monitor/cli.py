"""`specwise monitor` and `specwise estimate`."""

import argparse
import sys

from specwise.cli_args import add_dataclass_args, dataclass_from_args
from specwise.monitor import estimate_cli
from specwise.monitor.config import MonitorConfig


def register(subparsers) -> None:
    monitor = subparsers.add_parser(
        "monitor", help="watch a server's speculative decoding acceptance; alert on drift and overload",
        description="Scrape vLLM, SGLang or specwise /metrics pages each --interval: acceptance rate, mean "
                    "acceptance length, per-position acceptance, drafts per step, concurrency and output "
                    "tokens/s per window; a CUSUM drift test against a baseline; a warning when concurrency "
                    "sits above the break-even. Exit codes: 0 no alert, 1 alert, 2 bad flags or files, "
                    "3 a server could not be read (see docs/monitor.md).")
    add_dataclass_args(monitor, MonitorConfig)
    monitor.set_defaults(handler=run_monitor_command)
    estimate_cli.register(subparsers)


def run_monitor_command(args: argparse.Namespace) -> int:
    config = dataclass_from_args(MonitorConfig, args)
    if config.alert_rules:
        return print_alert_rules(config)
    from specwise.monitor.loop import run_monitor
    return run_monitor(config)


def print_alert_rules(config: MonitorConfig) -> int:
    from specwise.monitor.alert_rules import alert_rules
    from specwise.monitor.drift import Baseline
    baseline = config.loaded_baseline()
    if baseline is None and config.baseline_rate is not None:
        baseline = Baseline(acceptance_rate=config.baseline_rate, window_std=0.0, windows=config.baseline_windows)
    if baseline is None and config.break_even is None and config.results is None:
        print("specwise: note: no --baseline, --baseline-rate, --break-even or --results: the rules file is empty",
              file=sys.stderr)
    sys.stdout.write(alert_rules(config.server, baseline, config.drift, config.interval,
                                 config.resolved_break_even(), config.busy_windows))
    return 0

