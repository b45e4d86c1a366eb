"""Per-request sampling settings; the CLI and server flags are built from these fields.

Besides temperature / top-k / top-p, a request may ask for logits processing (applied to the
target's logits before temperature, see `engine/sampling/logits_processors.py`): `min_tokens`,
`logit_bias`, `repetition_penalty` (HF / vLLM: over prompt and output tokens), `frequency_penalty`
and `presence_penalty` (OpenAI: over output tokens), and `structured_output` (a grammar the output
must follow, `engine/sampling/grammar.py`). `logprobs` asks for the log-probability of each
generated token and of the `logprobs` most likely ones; `prompt_logprobs` the same for every prompt
token after the first (the target's raw log_softmax at the position before it, delivered with the
first output).
"""

from dataclasses import dataclass, field

from specwise.errors import ConfigError

STRUCTURED_KINDS = ("json", "json_object", "regex", "choice", "lark")
MAX_LOGPROBS = 20


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint on the output text. kind "json": `value` is a JSON schema (a JSON string);
    "json_object": any JSON object (value unused); "regex": a regular expression; "choice": a JSON
    list of allowed strings; "lark": a Lark grammar (llguidance's dialect)."""

    kind: str
    value: str = ""

    def __post_init__(self):
        if self.kind not in STRUCTURED_KINDS:
            raise ConfigError(f"structured output kind must be one of {', '.join(STRUCTURED_KINDS)}, got {self.kind!r}")


@dataclass
class SamplingParams:
    temperature: float = field(default=1.0, metadata={"help": "0 means greedy (argmax)"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling mass in (0, 1]"})
    top_k: int = field(default=0, metadata={"help": "keep the k most likely tokens; 0 keeps all"})
    max_tokens: int = field(default=128, metadata={"help": "most tokens to generate"})
    min_tokens: int = field(default=0, metadata={"help": "no end-of-sequence or stop token/string before this many"})
    seed: int | None = field(default=None, metadata={"help": "per-request seed: same seed, same output"})
    stop: list[str] = field(default_factory=list, metadata={"help": "stop strings (not included in the output)"})
    stop_token_ids: list[int] = field(default_factory=list, metadata={"help": "extra token ids that end generation"})
    ignore_eos: bool = field(default=False, metadata={"help": "keep generating past the end-of-sequence token"})
    speculative: bool = field(default=True, metadata={"help": "let this request use speculative decoding"})
    repetition_penalty: float = field(
        default=1.0, metadata={"help": "> 1 discourages tokens seen in prompt or output (logit / p if > 0 else * p)"})
    frequency_penalty: float = field(
        default=0.0, metadata={"help": "subtract this times a token's count in the output from its logit"})
    presence_penalty: float = field(
        default=0.0, metadata={"help": "subtract this from the logit of every token present in the output"})
    logit_bias: dict[int, float] = field(default_factory=dict, metadata={"help": "token id -> added to its logit"})
    logprobs: int | None = field(
        default=None, metadata={"help": "return each token's logprob and this many top alternatives (0..20)"})
    prompt_logprobs: int | None = field(
        default=None, metadata={"help": "return each prompt token's logprob and this many top alternatives (0..20)"})
    structured_output: StructuredOutput | None = field(default=None, metadata={"help": "a grammar to follow"})

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ConfigError(f"min_tokens must be in 0..max_tokens ({self.max_tokens}), got {self.min_tokens}")
        if any(not s for s in self.stop):
            raise ConfigError("stop strings must not be empty")
        if not self.repetition_penalty > 0:
            raise ConfigError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ConfigError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise ConfigError(f"{name} must be in 0..{MAX_LOGPROBS}, got {value}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def processes_logits(self) -> bool:
        """Does anything change the target's logits before temperature (see logits_processors.py)?"""
        return bool(self.min_tokens or self.logit_bias or self.repetition_penalty != 1.0
                    or self.frequency_penalty or self.presence_penalty or self.structured_output)
