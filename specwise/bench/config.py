"""`specwise evaluate` settings: one dataclass, flags generated from its fields."""

from dataclasses import dataclass, field

from specwise.bench.load import parse_values
from specwise.bench.recommend import DEFAULT_MARGIN, DEFAULT_METRIC, DEFAULT_THROUGHPUT_FLOOR
from specwise.bench.slo import parse_slo
from specwise.bench.suite import CATEGORIES
from specwise.bench.summary import LATENCY_KEYS
from specwise.bench.targets.http import APIS
from specwise.bench.traces import TRACE_FORMATS
from specwise.errors import ConfigError

DEFAULT_CONCURRENCY = "1,2,4,8,16,32,64"
# --quick: concurrency 1 to 16, two prompts per category, short outputs, sending stops
# after 12 s per point (stragglers cut at 24 s): with the default arms (off, ngram) that
# bounds the run to about 5 minutes, 10 points plus model load and warm-up.
QUICK = {"concurrency": "1,2,4,8,16", "per_category": 2, "max_tokens": 32, "duration": 12.0, "warmup": 1}


def _help(text: str, default=None):
    return field(default=default, metadata={"help": text})


@dataclass
class EvaluateConfig:
    methods: str = _help("in-process arms: off,ngram,draft:PATH,layer_skip:L (suffix @k sets k)", "off,ngram")
    endpoint: list[str] = field(default_factory=list, metadata={
        "help": "an OpenAI-compatible endpoint as an arm, NAME=URL (e.g. vllm-eagle=http://host:8000)"})
    baseline: str | None = _help("arm the others are compared with; none: the 'off' arm")
    api: str = _help("endpoint API: auto (chat for chat prompts), completions or chat", "auto")
    served_model: str | None = _help("model name sent to endpoints; none: the first of GET /v1/models")
    api_key: str | None = _help("bearer token for the endpoints; none: $OPENAI_API_KEY if set (never saved)")
    workload: str = _help("suite, suite:CAT1,CAT2 or a JSONL file (prompt or messages per line)", "suite")
    per_category: int | None = _help("suite prompts per category; none: all of them")
    trace: str | None = _help("replay a production trace: Azure CSV, Mooncake JSONL or BurstGPT CSV")
    trace_format: str | None = _help("trace format: azure, mooncake or burstgpt; none: detected")
    trace_category: str = _help("suite category whose text fills synthesized trace prompts", "chat")
    time_scale: float = _help("trace replay speed: 2 replays twice as fast", 1.0)
    concurrency: str | None = _help(f"closed-loop concurrency sweep; none (and no --rate or --trace): {DEFAULT_CONCURRENCY}")
    rate: str | None = _help("open-loop request rates, requests/s, e.g. 0.5,1,2")
    burstiness: float = _help("arrival burstiness for --rate: 1 = Poisson, < 1 burstier", 1.0)
    num_requests: int | None = _help("requests per load point; none: max(4 x concurrency, 24), a trace's every row")
    duration: float | None = _help("stop sending new requests after this many seconds per load point")
    warmup: int = _help("warm-up requests per arm, excluded from figures", 2)
    max_tokens: int | None = _help("cap every request's output length")
    temperature: float = _help("sampling temperature for every arm (0 = greedy)", 0.0)
    slo: str | None = _help("SLOs for goodput, e.g. ttft=500ms,tpot=50ms,e2e=10s")
    pay_metric: str = _help("latency metric deciding where speculation pays", DEFAULT_METRIC)
    margin: float = _help("latency gain needed to count as paying (0.05: 5 percent)", DEFAULT_MARGIN)
    throughput_floor: float = _help("throughput kept, relative to no speculation", DEFAULT_THROUGHPUT_FLOOR)
    output: str | None = _help("results directory (default: specwise-results/<timestamp>)")
    quick: bool = _help("a ~5 minute run: concurrency 1-16, 2 prompts per category, short outputs", False)
    skip_bad_rows: bool = _help("skip malformed workload/trace rows (counted) instead of stopping", False)
    request_timeout: float = _help("seconds before one request counts as failed", 300.0)
    tokenizer: str | None = _help("tokenizer.json for endpoint runs (token counts without usage)")
    seed: int = _help("seed for arrival times and sampling", 0)
    progress: bool = _help("live progress bars and table", True)

    def __post_init__(self):
        if self.quick:
            self._apply_quick()
        if self.trace is None and self.rate is None and self.concurrency is None:
            self.concurrency = DEFAULT_CONCURRENCY
        self._check()

    def _apply_quick(self):
        """--quick sets the settings left at their defaults."""
        for key, value in QUICK.items():
            if key == "concurrency" and (self.rate or self.trace):
                continue
            if getattr(self, key) == self.__dataclass_fields__[key].default:
                setattr(self, key, value)

    def _check(self):
        if self.concurrency is not None:
            parse_values(self.concurrency, "--concurrency", integer=True)
        if self.rate is not None:
            parse_values(self.rate, "--rate")
        parse_slo(self.slo)
        if self.api not in APIS:
            raise ConfigError(f"--api must be one of {', '.join(APIS)}, got {self.api!r}")
        if self.trace_format is not None and self.trace_format not in TRACE_FORMATS:
            raise ConfigError(f"--trace-format must be one of {', '.join(TRACE_FORMATS)}")
        if self.trace_category not in CATEGORIES:
            raise ConfigError(f"--trace-category must be one of {', '.join(CATEGORIES)}")
        if self.pay_metric not in LATENCY_KEYS:
            raise ConfigError(f"--pay-metric must be one of {', '.join(LATENCY_KEYS)}")
        positive = {"time_scale": self.time_scale, "burstiness": self.burstiness,
                    "request_timeout": self.request_timeout, "duration": self.duration,
                    "num_requests": self.num_requests, "max_tokens": self.max_tokens,
                    "per_category": self.per_category}
        for name, value in positive.items():
            if value is not None and value <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0, got {value}")
        if self.warmup < 0 or self.temperature < 0 or self.margin < 0:
            raise ConfigError("--warmup, --temperature and --margin must be >= 0")
        if not 0 < self.throughput_floor <= 1.5:
            raise ConfigError(f"--throughput-floor must be in (0, 1.5], got {self.throughput_floor}")
