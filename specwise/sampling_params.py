"""Per-request sampling settings; the CLI and server flags are built from these fields."""

from dataclasses import dataclass, field

from specwise.errors import ConfigError


@dataclass
class SamplingParams:
    temperature: float = field(default=1.0, metadata={"help": "0 means greedy (argmax)"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling mass in (0, 1]"})
    top_k: int = field(default=0, metadata={"help": "keep the k most likely tokens; 0 keeps all"})
    max_tokens: int = field(default=128, metadata={"help": "most tokens to generate"})
    seed: int | None = field(default=None, metadata={"help": "per-request seed: same seed, same output"})
    stop: list[str] = field(default_factory=list, metadata={"help": "stop strings (not included in the output)"})
    stop_token_ids: list[int] = field(default_factory=list, metadata={"help": "extra token ids that end generation"})
    ignore_eos: bool = field(default=False, metadata={"help": "keep generating past the end-of-sequence token"})
    speculative: bool = field(default=True, metadata={"help": "let this request use speculative decoding"})

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
        if any(not s for s in self.stop):
            raise ConfigError("stop strings must not be empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
