"""`specwise estimate --log FILE --method M [--k K]`: flags, the streamed run, the tables."""

import argparse
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from specwise.bench.inputs.bad_rows import BadRows
from specwise.calc.deployment import Deployment, DeploymentConfig
from specwise.calc.roofline import RooflineCost
from specwise.cli_args import add_dataclass_args, dataclass_from_args
from specwise.engine.cost.step_profile import load_step_cost
from specwise.engine.spec_decode.config import MAX_SPECULATIVE_TOKENS, SpeculativeConfig
from specwise.errors import ConfigError, SpecwiseError
from specwise.monitor.estimate import Estimate, estimate_acceptance, expected_speedup
from specwise.monitor.logs import read_log
from specwise.monitor.replay import NgramDrafter

NOT_YET = {"suffix": "the suffix-tree drafter", "eagle": "EAGLE heads", "medusa": "Medusa heads"}
# drafters whose drafts come from the target's own forward at each step: a log cannot be replayed for them
NOT_REPLAYABLE = {"lookahead": "lookahead decoding drafts from the target's own forward at every step"}


@dataclass
class EstimateConfig:
    log: str | None = field(default=None, metadata={
        "help": "JSONL log of prompts and completions (token ids, prompt/completion, or OpenAI request/response)"})
    method: str = field(default="ngram", metadata={
        "help": "drafter: ngram, ngram:MIN-MAX, draft:PATH, layer_skip:L (suffix, eagle, medusa: not available yet)"})
    k: int = field(default=4, metadata={"help": "draft tokens per step"})
    target: str | None = field(default=None, metadata={
        "help": "the target model (HF directory or GGUF): its tokenizer, and its layers for layer_skip "
                "(default: the default model)"})
    skip_bad_rows: bool = field(default=False, metadata={"help": "skip and count malformed log lines"})
    concurrency: str = field(default="1,8,32", metadata={"help": "concurrency levels for the speedup, e.g. 1,8,32"})
    draft_cost: float | None = field(default=None, metadata={
        "help": "one draft token's cost relative to a target decode step (default: 0 for ngram, "
                "L / layers for layer_skip; needed for draft:PATH)"})
    profile: str | None = field(default=None, metadata={
        "help": "measured step-time profile JSON instead of the roofline of --gpu / --model"})
    dtype: str = field(default="float32", metadata={"help": "compute dtype of model drafters"})
    device: str = field(default="cpu", metadata={"help": "torch device of model drafters"})
    json_out: str | None = field(default=None, metadata={"help": "also write the estimate as JSON here"})
    progress: bool = field(default=True, metadata={"help": "progress bar while reading the log"})

    def __post_init__(self):
        if not self.log:
            raise ConfigError("give --log FILE (a JSONL log of prompts and completions)")
        if not 1 <= self.k <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(f"--k must be in 1..{MAX_SPECULATIVE_TOKENS}, got {self.k}")
        name = self.method.strip().lower().partition(":")[0]
        if name in NOT_YET:
            raise ConfigError(f"{self.method}: not available yet: estimate cannot replay {NOT_YET[name]} over a "
                              f"log; use ngram, draft:PATH or layer_skip:L (or measure it with specwise evaluate)")
        if name in NOT_REPLAYABLE:
            raise ConfigError(f"{self.method}: estimate cannot replay it from a log: {NOT_REPLAYABLE[name]}; "
                              f"measure it with specwise evaluate --methods off,{name}")
        self.spec = SpeculativeConfig.parse(self.method, self.k)
        if self.spec is None:
            raise ConfigError("--method must name a drafter, not none/off")

    def concurrency_list(self) -> list[int]:
        try:
            levels = sorted({int(part) for part in self.concurrency.split(",") if part.strip()})
        except ValueError:
            raise ConfigError(f"--concurrency must be integers separated by commas, got {self.concurrency!r}") from None
        if not levels or levels[0] < 1:
            raise ConfigError("--concurrency levels must be >= 1")
        return levels


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "estimate", help="the acceptance a drafter would get on logged traffic, and the speedup it would bring",
        description="Replay logged prompts + completions through a drafter (n-gram: exact under greedy; model "
                    "drafters: teacher-forced), per category and per position, then the expected speedup at "
                    "each concurrency through the throughput calculator. See docs/monitor.md.")
    add_dataclass_args(parser, EstimateConfig)
    calculator = parser.add_argument_group("speedup calculator (target on a GPU from the catalog)")
    add_dataclass_args(calculator, DeploymentConfig)
    parser.set_defaults(handler=run_estimate)


class LazyTokenizer:
    """The target's tokenizer, loaded on first use (logs of token ids never need it)."""

    def __init__(self, target: str | None):
        self.target = target
        self.tokenizer = None

    def __getattr__(self, name):
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(self.target)
        return getattr(self.tokenizer, name)


def load_tokenizer(target: str | None):
    from specwise.models.checkpoints.loader import load_checkpoint, resolve
    from specwise.models.tokenizer import Tokenizer
    if target is not None and resolve(Path(target).expanduser()).is_dir():
        return Tokenizer.from_hf_dir(resolve(Path(target).expanduser()))     # no weights needed
    return load_checkpoint(target).tokenizer


def build_drafter(config: EstimateConfig, tokenizer):
    spec = config.spec
    if spec.method == "ngram":
        return NgramDrafter(spec.ngram_min_n, spec.ngram_max_n)
    import torch
    from specwise.monitor.scoring import model_drafter
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(config.dtype)
    if dtype is None:
        raise ConfigError(f"--dtype must be float32, bfloat16 or float16, got {config.dtype!r}")
    return model_drafter(spec, None, config.target, tokenizer, dtype, config.device)


def run_estimate(args: argparse.Namespace) -> int:
    config = dataclass_from_args(EstimateConfig, args)
    deployment_config = dataclass_from_args(DeploymentConfig, args)
    console = Console()
    tokenizer = LazyTokenizer(config.target)
    drafter = build_drafter(config, tokenizer)
    bad_rows = BadRows(skip=config.skip_bad_rows)
    result = estimate_log(config, drafter, tokenizer, bad_rows)
    if bad_rows.count:
        console.print(f"skipped {bad_rows.count} bad line(s); first: {bad_rows.examples[0]}", markup=False)
    if not result.overall.requests:
        raise SpecwiseError(f"{config.log}: no usable request in the log")
    print_estimate(console, result)
    speedups = speedup_table(config, deployment_config, result, default_draft_cost(config, drafter))
    if speedups is not None:
        console.print(speedups)
    if config.json_out:
        Path(config.json_out).write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    return 0


def estimate_log(config: EstimateConfig, drafter, tokenizer, bad_rows: BadRows) -> Estimate:
    path = Path(config.log)
    if not path.is_file():
        raise ConfigError(f"{path}: no such log file")
    columns = (TextColumn("reading {task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, transient=True, disable=not config.progress, console=Console(stderr=True)) as bar:
        task = bar.add_task(path.name, total=os.path.getsize(path))
        requests = read_log(path, tokenizer, bad_rows, on_bytes=lambda n: bar.advance(task, n))
        return estimate_acceptance(requests, drafter, config.spec.label, config.k)


def print_estimate(console: Console, result: Estimate) -> None:
    table = Table(title=f"{result.method}, k = {result.k}: acceptance on the logged traffic", title_justify="left")
    for column in ("category", "requests", "drafts", "acceptance rate", "mean acceptance length",
                   "steps that drafted", "per position"):
        table.add_column(column, justify="left" if column == "category" else "right")
    rows = [*sorted(result.categories.items()), ("all", result.overall)]
    for name, part in rows:
        stats = part.stats
        table.add_row(name, str(part.requests), str(stats.drafts), _fmt(stats.acceptance_rate, ".3f"),
                      _fmt(stats.mean_acceptance_length, ".2f"), _fmt(part.drafted_share, ".0%"),
                      " ".join(f"{p:.2f}" for p in stats.per_position_acceptance or []) or "-")
    console.print(table)
    if result.sampled_requests:
        console.print(f"{result.sampled_requests} request(s) were sampled (temperature > 0): their figures are "
                      f"the greedy acceptance, an approximation")


def default_draft_cost(config: EstimateConfig, drafter) -> float | None:
    """--draft-cost, else layer_skip:L's share of the target's layers (its drafter is the target)."""
    if config.draft_cost is not None or config.spec.method != "layer_skip":
        return config.draft_cost
    return config.spec.layer_skip_layers / drafter.model.config.num_hidden_layers


def speedup_table(config: EstimateConfig, deployment_config: DeploymentConfig, result: Estimate,
                  draft_cost: float | None) -> Table:
    deployment = Deployment.from_config(deployment_config)
    cost = load_step_cost(config.profile) if config.profile else RooflineCost(deployment)
    where = f"profile {config.profile}" if config.profile else deployment.label()
    table = Table(title=f"expected decode throughput with {result.method} on {where}", title_justify="left")
    for column in ("category", "concurrency", "off tok/s", "spec tok/s", "speedup"):
        table.add_column(column, justify="left" if column == "category" else "right")
    parts = [("all", result.overall), *sorted(result.categories.items())]
    for name, part in parts:
        try:
            rows = expected_speedup(part, config.spec.method, config.k, cost, deployment,
                                    config.concurrency_list(), draft_cost)
        except ConfigError as error:
            table.add_row(name, "-", "-", "-", str(error))
            continue
        for row in rows:
            table.add_row(name, str(row.concurrency), f"{row.off_tokens_per_s:,.0f}", f"{row.spec_tokens_per_s:,.0f}",
                          f"{row.ratio:.2f}x")
    return table


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)
