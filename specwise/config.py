"""Engine settings as one dataclass; `specwise` flags are generated from these fields."""

from dataclasses import dataclass, field

from specwise.errors import ConfigError

DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("none", "int8", "int4")     # weight-only formats, see specwise/models/quantize.py
MAX_SPECULATIVE_TOKENS = 16                  # the largest k anywhere: engine, k tables, arms, calculators
# A step of up to this many tokens is bound by reading the weights, not by computing: at batch 1 the
# default model reads its 270 MB in ~25 ms, and one core computes ~1 ms of bf16 matmuls per token
DECODE_STEP_TOKENS = 32


@dataclass
class EngineConfig:
    model: str | None = field(
        default=None, metadata={"help": "HF directory or GGUF file; default: embedded SmolLM2-135M-Instruct"})
    dtype: str = field(default="auto", metadata={
        "help": "compute dtype: auto (bfloat16 where the CPU has native bf16 instructions, else float32), "
                "float32, bfloat16 or float16"})
    quantization: str = field(
        default="none", metadata={"help": "weight-only format: none, int8 or int4 (LM head int8); needs "
                                          "--dtype bfloat16"})
    max_num_seqs: int = field(default=64, metadata={"help": "most sequences in one step (batch size)"})
    max_num_batched_tokens: int = field(
        default=512, metadata={"help": "most tokens in one step: decodes and drafts first, prompt chunks fill the "
                                       "rest (a longer prompt is prefilled over several steps)"})
    max_model_len: int = field(default=2048, metadata={"help": "longest prompt + output, in tokens"})
    block_size: int = field(default=16, metadata={"help": "tokens per KV-cache block"})
    kv_cache_gb: float = field(default=1.0, metadata={"help": "memory budget of the paged KV cache, GiB (never "
                                                             "more than max_num_seqs full-length sequences take)"})
    num_kv_blocks: int | None = field(default=None, metadata={"help": "KV-cache blocks (overrides --kv-cache-gb)"})
    seed: int = field(default=0, metadata={"help": "engine seed for requests without their own"})
    num_threads: int | None = field(
        default=None, metadata={"help": "torch threads computing each step (default: torch's choice, one per "
                                        "core)"})
    decode_threads: int | None = field(
        default=None, metadata={"help": f"torch threads for steps of at most {DECODE_STEP_TOKENS} tokens (decoding a few "
                                        "sequences mostly reads weights); default: as --num-threads"})
    device: str = field(default="cpu", metadata={"help": "torch device"})
    # None (evaluate's default): the compiled graphs when the compile cache already holds them, else eager
    compile: bool | None = field(default=False, metadata={
        "help": "compile the model's forward with inductor (models/compile/graphs.py): faster steps, minutes more "
                "at start-up the first time on a machine (the graphs are cached)"})
    speculative: str | None = field(
        default=None, metadata={"help": "drafter: ngram, draft:PATH, layer_skip:L, suffix, lookahead[:W,N,G], "
                                        "eagle[:DIR], medusa[:DIR] (none = off)"})
    num_speculative_tokens: int = field(default=4, metadata={"help": "draft tokens per step (k, the most with a policy)"})
    speculative_policy: str = field(
        default="static", metadata={"help": "k per step: static, auto (cost model + measured acceptance), "
                                            "or table:1=4/8=2/32=0 (k 4 from batch 1, 2 from 8, off from 32)"})
    step_profile: str | None = field(
        default=None, metadata={"help": "step-cost profile from `specwise calibrate` for --speculative-policy auto "
                                        "(default: measured at start-up)"})
    step_log: str | None = field(
        default=None, metadata={"help": "append every step's shape and seconds to this file, a JSON line each "
                                        "(engine/step_log.py; benchmarks/step_log_check.py holds a profile "
                                        "against them)"})

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}")
        if self.quantization != "none" and self.dtype not in ("bfloat16", "auto"):
            raise ConfigError(f"{self.quantization} weights run with bfloat16 activations: add --dtype bfloat16")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("num_threads", "decode_threads"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_cache_gb <= 0:
            raise ConfigError(f"kv_cache_gb must be > 0, got {self.kv_cache_gb}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ConfigError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if not (self.speculative_policy in ("static", "auto") or self.speculative_policy.startswith("table:")):
            raise ConfigError(f"speculative_policy must be static, auto or table:..., got {self.speculative_policy!r}")
        if not 0 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(f"num_speculative_tokens must be in 0..{MAX_SPECULATIVE_TOKENS}, "
                              f"got {self.num_speculative_tokens}")
