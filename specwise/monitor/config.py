"""`specwise monitor` settings: one dataclass, the flags built from its fields (cli_args.py)."""

from dataclasses import dataclass, field

from specwise.errors import ConfigError
from specwise.monitor.busy import DEFAULT_BUSY_WINDOWS, break_even_from_results
from specwise.monitor.drift import (DEFAULT_H, DEFAULT_K, DEFAULT_MIN_DRAFTS, DEFAULT_MIN_STD, Baseline,
                                    DriftSettings)
from specwise.monitor.watch import DEFAULT_BASELINE_WINDOWS

SERVERS = ("vllm", "sglang", "specwise")


@dataclass
class MonitorConfig:
    metrics_url: list[str] = field(default_factory=list, metadata={
        "help": "a server's Prometheus page, e.g. http://localhost:8000/metrics"})
    interval: float = field(default=60.0, metadata={"help": "seconds per window (between scrapes)"})
    once: bool = field(default=False, metadata={
        "help": "one window and exit (for cron): with --state, from the last run's scrape; else two scrapes "
                "--interval apart"})
    state: str | None = field(default=None, metadata={
        "help": "JSON file keeping scrapes, baseline and detector state between --once runs"})
    max_windows: int | None = field(default=None, metadata={"help": "stop after this many windows"})
    duration: float | None = field(default=None, metadata={"help": "stop after this many seconds"})
    log: str | None = field(default=None, metadata={"help": "append one JSON line per window to this file"})
    webhook: str | None = field(default=None, metadata={"help": "POST each alert as JSON to this URL"})
    dashboard: bool = field(default=True, metadata={"help": "live terminal dashboard (else one line per window)"})
    baseline: str | None = field(default=None, metadata={
        "help": "baseline file (--save-baseline wrote it) instead of the first windows"})
    save_baseline: str | None = field(default=None, metadata={
        "help": "write the baseline built from the first windows to this file"})
    baseline_windows: int = field(default=DEFAULT_BASELINE_WINDOWS, metadata={
        "help": "windows with figures the baseline is built from"})
    baseline_rate: float | None = field(default=None, metadata={
        "help": "--alert-rules only: baseline acceptance rate, when there is no --baseline file"})
    break_even: float | None = field(default=None, metadata={
        "help": "concurrency above which speculation stops paying (warn when it sits above)"})
    results: str | None = field(default=None, metadata={
        "help": "read the break-even from this `specwise evaluate` results directory"})
    arm: str | None = field(default=None, metadata={"help": "with --results: the arm whose break-even to use"})
    busy_windows: int = field(default=DEFAULT_BUSY_WINDOWS, metadata={
        "help": "windows in a row above the break-even before warning"})
    cusum_k: float = field(default=DEFAULT_K, metadata={"help": "CUSUM allowance, in baseline sigmas"})
    cusum_h: float = field(default=DEFAULT_H, metadata={"help": "CUSUM threshold, in baseline sigmas"})
    min_std: float = field(default=DEFAULT_MIN_STD, metadata={"help": "floor on the baseline sigma"})
    min_drafts: int = field(default=DEFAULT_MIN_DRAFTS, metadata={
        "help": "windows with fewer drafts carry no evidence"})
    timeout: float = field(default=10.0, metadata={"help": "seconds to wait for a /metrics page"})
    alert_rules: bool = field(default=False, metadata={
        "help": "print equivalent Prometheus alerting rules (YAML) and exit"})
    server: str = field(default="vllm", metadata={"help": "--alert-rules: vllm, sglang or specwise metric names"})

    def __post_init__(self):
        if self.interval <= 0 or self.timeout <= 0:
            raise ConfigError("--interval and --timeout must be > 0")
        if self.baseline_windows < 5:
            raise ConfigError(f"--baseline-windows must be >= 5 (a spread from fewer windows means little), "
                              f"got {self.baseline_windows}")
        if self.max_windows is not None and self.max_windows < 1:
            raise ConfigError("--max-windows must be >= 1")
        if self.break_even is not None and self.results is not None:
            raise ConfigError("give --break-even or --results, not both")
        if self.arm is not None and self.results is None:
            raise ConfigError("--arm picks a break-even from --results; give --results too")
        if self.baseline and self.save_baseline:
            raise ConfigError("--baseline reads a baseline, --save-baseline writes one: give one of them")
        if self.server not in SERVERS:
            raise ConfigError(f"--server must be one of {', '.join(SERVERS)}, got {self.server!r}")
        if not self.alert_rules:
            if not self.metrics_url:
                raise ConfigError("give --metrics-url URL (repeatable), or --alert-rules")
            if self.save_baseline and len(self.metrics_url) > 1:
                raise ConfigError("--save-baseline takes one --metrics-url (each server has its own baseline)")
            if self.state and not self.once:
                raise ConfigError("--state keeps state between --once runs; add --once")
        self.drift = DriftSettings(k=self.cusum_k, h=self.cusum_h, min_std=self.min_std, min_drafts=self.min_drafts)

    def resolved_break_even(self) -> float | None:
        if self.results is not None:
            return break_even_from_results(self.results, self.arm)
        if self.break_even is not None and self.break_even <= 0:
            raise ConfigError(f"--break-even must be > 0, got {self.break_even}")
        return self.break_even

    def loaded_baseline(self) -> Baseline | None:
        return Baseline.load(self.baseline) if self.baseline else None
