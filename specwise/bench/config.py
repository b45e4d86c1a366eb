"""`specwise evaluate` settings: one dataclass, flags generated from its fields."""

from dataclasses import dataclass, field

from specwise.bench.load.config import LoadConfig, check_positive, help_field
from specwise.bench.report.recommend import DEFAULT_MARGIN, DEFAULT_METRIC, DEFAULT_THROUGHPUT_FLOOR
from specwise.bench.load.slo import parse_slo
from specwise.bench.inputs.suite import CATEGORIES
from specwise.bench.report.summary import PAY_METRICS
from specwise.bench.load.schedule import LOCAL_SETTLE, SCHEDULES
from specwise.bench.stats.bootstrap import DEFAULT_LEVEL
from specwise.bench.load.targets.http import APIS
from specwise.errors import ConfigError

# --quick: concurrency 1 to 16, two prompts per category, short outputs, sending stops
# after 12 s per point (stragglers cut at 24 s): with the default arms (off, ngram) that
# bounds the run to about 5 minutes, 10 points plus model load and warm-up.
# It asks for --precision 0.05, which the 12 s cap usually stops first: the verdicts then
# say "can't tell" where 12 s of requests cannot decide.
QUICK = {"concurrency": "1,2,4,8,16", "per_category": 2, "max_tokens": 32, "duration": 12.0, "warmup": 1,
         "precision": 0.05}
DEFAULT_METHODS = "off,ngram"


@dataclass
class EvaluateConfig(LoadConfig):
    methods: str | None = help_field("in-process arms: off,ngram,suffix,lookahead[:W,N,G],draft:PATH,layer_skip:L,"
                                     "eagle[:DIR],medusa[:DIR] (NAME@k sets k; for lookahead its prompt-lookup "
                                     "candidate's length); "
                                     f"none: {DEFAULT_METHODS} without --endpoint, no in-process arm with one")
    endpoint: list[str] = field(default_factory=list, metadata={
        "help": "an OpenAI-compatible endpoint as an arm, NAME=URL (e.g. vllm-eagle=http://host:8000); "
                "combines with --methods in one run"})
    schedule: str = help_field("arm order at each load point: interleaved (rounds A B | B A ...), sequential "
                               "(one arm after the other) or auto (interleaved unless a draft-model arm would "
                               "reload its weights at every switch)", "auto")
    round_size: int | None = help_field("requests per interleaved round; none: max(2 x concurrency, 4), 24 open-loop")
    settle: float | None = help_field("seconds of pause before an arm's round when the previous round was "
                                      "another arm's, so that a server sharing this machine goes quiet first "
                                      "(vLLM for CPU keeps a core busy ~1 s after its last request); none: "
                                      f"{LOCAL_SETTLE:g} when an --endpoint is on this machine (loopback) and there are several "
                                      "arms, else 0")
    precision: float | None = help_field("add rounds at each load point until every compared ratio's interval "
                                         "is within +-this fraction (0.05: 5 percent), capped by --duration "
                                         "(per arm) or --num-requests")
    confidence: float = help_field("confidence level of the intervals and verdicts", DEFAULT_LEVEL)
    baseline: str | None = help_field("arm the others are compared with; none: the 'off' arm")
    api: str = help_field("endpoint API: auto (chat for chat prompts), completions or chat", "auto")
    served_model: str | None = help_field("model name sent to endpoints; none: the first of GET /v1/models")
    api_key: str | None = help_field("bearer token for the endpoints; none: $OPENAI_API_KEY if set (never saved)")
    trace_category: str = help_field("suite category whose text fills synthesized trace prompts", "chat")
    warmup: int = help_field("warm-up requests per arm, excluded from figures", 2)
    temperature: float = help_field("sampling temperature for every arm (0 = greedy)", 0.0)
    slo: str | None = help_field("SLOs for goodput, e.g. ttft=500ms,tpot=50ms,e2e=10s")
    pay_metric: str = help_field("latency metric deciding where speculation pays", DEFAULT_METRIC)
    margin: float = help_field("latency gain needed to count as paying (0.05: 5 percent)", DEFAULT_MARGIN)
    throughput_floor: float = help_field("throughput kept, relative to no speculation", DEFAULT_THROUGHPUT_FLOOR)
    output: str | None = help_field("results directory (default: specwise-results/<timestamp>)")
    quick: bool = help_field("a ~5 minute run: concurrency 1-16, 2 prompts per category, short outputs", False)
    request_timeout: float = help_field("seconds before one request counts as failed", 300.0)
    tokenizer: str | None = help_field("tokenizer.json for endpoint runs (token counts without usage)")
    progress: bool = help_field("live progress bars and table", True)

    def __post_init__(self):
        if self.quick:
            self._apply_quick()
        super().__post_init__()
        self._check()

    def _apply_quick(self):
        """--quick sets the settings left at their defaults."""
        for key, value in QUICK.items():
            if key == "concurrency" and (self.rate or self.trace):
                continue
            if getattr(self, key) == self.__dataclass_fields__[key].default:
                setattr(self, key, value)

    def in_process_methods(self) -> str | None:
        """The --methods to run in-process: as given, else the default when there is no endpoint."""
        return self.methods if self.methods is not None or self.endpoint else DEFAULT_METHODS

    def _check(self):
        parse_slo(self.slo)
        if self.api not in APIS:
            raise ConfigError(f"--api must be one of {', '.join(APIS)}, got {self.api!r}")
        if self.trace_category not in CATEGORIES:
            raise ConfigError(f"--trace-category must be one of {', '.join(CATEGORIES)}")
        if self.pay_metric not in PAY_METRICS:
            raise ConfigError(f"--pay-metric must be one of {', '.join(PAY_METRICS)}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        check_positive(self, "round_size")
        if not 0.5 <= self.confidence < 1:
            raise ConfigError(f"--confidence must be in [0.5, 1), got {self.confidence}")
        if self.precision is not None and not 0 < self.precision < 1:
            raise ConfigError(f"--precision must be in (0, 1), e.g. 0.05, got {self.precision}")
        if self.precision is not None and self.duration is None and self.num_requests is None:
            raise ConfigError("--precision needs a cap: --duration (seconds per arm at each load point) "
                              "or --num-requests")
        check_positive(self, "request_timeout")
        if self.warmup < 0 or self.temperature < 0 or self.margin < 0 or (self.settle or 0) < 0:
            raise ConfigError("--warmup, --temperature, --margin and --settle must be >= 0")
        if not 0 < self.throughput_floor <= 1.5:
            raise ConfigError(f"--throughput-floor must be in (0, 1.5], got {self.throughput_floor}")
