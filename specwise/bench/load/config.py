"""What a run sends, as flags: the workload, the load points and their bounds.

`evaluate` (measured) and `simulate` (on paper) share these fields, so the same flags
give the same requests at the same load points in both (bench/load/plan.py builds them).
"""

from dataclasses import dataclass, field
from typing import ClassVar

from specwise.bench.load.arrivals import parse_values
from specwise.bench.load.order import ORDERS
from specwise.bench.inputs.traces import BUILTIN_TRACES, TRACE_FORMATS
from specwise.errors import ConfigError

DEFAULT_CONCURRENCY = "1,2,4,8,16,32,64"


def help_field(text: str, default=None):
    return field(default=default, metadata={"help": text})


@dataclass
class LoadConfig:
    workload: str = help_field("suite, suite:CAT1,CAT2 or a JSONL file (prompt or messages per line)", "suite")
    per_category: int | None = help_field("suite prompts per category; none: all of them")
    trace: str | None = help_field(f"replay a production trace: built-in {' or '.join(BUILTIN_TRACES)} "
                                   "(Azure LLM inference 2023, one hour each), or a file: Azure CSV, "
                                   "Mooncake JSONL or BurstGPT CSV")
    trace_format: str | None = help_field("trace format: azure, mooncake or burstgpt; none: detected")
    time_scale: float = help_field("trace replay speed: 2 replays twice as fast", 1.0)
    concurrency: str | None = help_field("closed-loop concurrency sweep; none (and no --rate or --trace): the default sweep")
    rate: str | None = help_field("open-loop request rates, requests/s, e.g. 0.5,1,2")
    burstiness: float = help_field("arrival burstiness for --rate: 1 = Poisson, < 1 burstier", 1.0)
    num_requests: int | None = help_field("requests per load point; none: max(4 x concurrency, 24), a trace's every row")
    duration: float | None = help_field("stop sending new requests after this many seconds per load point "
                                   "(those still running at twice that are cut off)")
    max_tokens: int | None = help_field("cap every request's output length")
    skip_bad_rows: bool = help_field("skip malformed workload/trace rows (counted) instead of stopping", False)
    seed: int = help_field("seed for the request order, arrival times and random draws", 0)
    order: str = help_field("request order at each load point: seeded (drawn from --seed, categories "
                            "interleaved) or file (as given); traces keep their arrival order", "seeded")

    default_concurrency: ClassVar[str] = DEFAULT_CONCURRENCY

    def __post_init__(self):
        if self.trace is None and self.rate is None and self.concurrency is None:
            self.concurrency = self.default_concurrency
        self._check_load()

    def _check_load(self):
        if self.concurrency is not None:
            parse_values(self.concurrency, "--concurrency", integer=True)
        if self.rate is not None:
            parse_values(self.rate, "--rate")
        if self.order not in ORDERS:
            raise ConfigError(f"--order must be one of {', '.join(ORDERS)}, got {self.order!r}")
        if self.trace_format is not None and self.trace_format not in TRACE_FORMATS:
            raise ConfigError(f"--trace-format must be one of {', '.join(TRACE_FORMATS)}")
        for name in ("time_scale", "burstiness", "num_requests", "duration", "max_tokens", "per_category"):
            check_positive(self, name)


def check_positive(config, name: str) -> None:
    value = getattr(config, name)
    if value is not None and value <= 0:
        raise ConfigError(f"--{name.replace('_', '-')} must be > 0, got {value}")
