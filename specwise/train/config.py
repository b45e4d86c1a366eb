"""`specwise train-drafter` settings as one dataclass; the flags are generated from its fields."""

from dataclasses import dataclass, field

from specwise.config import DTYPES, MAX_SPECULATIVE_TOKENS
from specwise.errors import ConfigError
from specwise.models.export.export_formats import EXPORT_FORMATS

KINDS = ("eagle", "eagle3", "medusa", "draft")


@dataclass
class TrainConfig:
    kind: str = field(default="eagle", metadata={"help": "what to train: eagle (one decoder layer over the target's "
                                                         "features), eagle3 (one decoder layer over three of its "
                                                         "layers, fused), medusa (residual heads) or draft (a small "
                                                         "model)"})
    out: str = field(default="", metadata={"help": "directory to write the drafter to (its work/ folder keeps data "
                                                   "and checkpoints)"})
    target: str | None = field(default=None, metadata={
        "help": "target model: HF directory or GGUF file; default: embedded SmolLM2-135M-Instruct"})
    data: str = field(default="suite", metadata={
        "help": "prompts: 'suite' (the built-in training prompts, disjoint from the evaluation suite) or a JSONL "
                "workload file"})
    corpus: str | None = field(default=None, metadata={
        "help": "a JSONL of documents ({\"text\": ...}) or conversations ({\"messages\": [...]}) the target reads "
                "as they are (its features over them by teacher-forced forwards, no generation), trained on "
                "together with the self-distilled answers to --data"})
    corpus_tokens: int = field(default=1_000_000, metadata={"help": "most tokens read from --corpus (file order)"})
    resume: bool = field(default=False, metadata={"help": "continue from the last checkpoint in OUT/work"})
    seed: int = field(default=0, metadata={"help": "seed of the held-out split, data order, noise and initialisation"})
    num_threads: int | None = field(default=None, metadata={"help": "torch threads (default: torch's choice)"})
    dtype: str = field(default="auto", metadata={"help": "the target's compute dtype when generating and recording "
                                                         "features (use the one you will serve with)"})
    max_tokens: int = field(default=192, metadata={"help": "most response tokens per prompt (a prompt's own "
                                                           "max_tokens lowers it)"})
    temperature: float = field(default=0.0, metadata={"help": "temperature of the target's responses (0: greedy)"})
    generation_batch: int = field(default=64, metadata={"help": "prompts generated at once"})
    held_out: float = field(default=0.1, metadata={"help": "fraction of each category's prompts kept for the "
                                                           "acceptance measured each epoch"})
    autocast: bool = field(default=True, metadata={
        "help": "run the training matmuls in bfloat16 (torch.autocast) where the CPU has native bf16 "
                "instructions; weights and optimizer stay fp32"})
    epochs: int = field(default=18, metadata={"help": "passes over the training sequences"})
    batch_tokens: int = field(default=512, metadata={"help": "tokens per optimizer step (whole sequences)"})
    lr: float = field(default=2e-3, metadata={"help": "peak AdamW learning rate"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    warmup_steps: int = field(default=100, metadata={"help": "linear warm-up steps before the cosine decay"})
    clip: float = field(default=1.0, metadata={"help": "gradient-norm clip"})
    checkpoint_every: int = field(default=200, metadata={"help": "optimizer steps between checkpoints"})
    eval_k: int = field(default=4, metadata={"help": "draft tokens per simulated step in the held-out acceptance"})
    eval_stride: int = field(default=8, metadata={"help": "held-out acceptance after each epoch but the last drafts "
                                                           "from every n-th position (the last: from every one)"})
    num_heads: int = field(default=4, metadata={"help": "medusa: heads (the largest k it drafts)"})
    draft_layers: int = field(default=4, metadata={"help": "draft: decoder layers of the draft model (spread over "
                                                           "the target's, copied from it)"})
    feature_noise: float = field(default=0.1, metadata={"help": "eagle, eagle3: std of Gaussian noise on input "
                                                                "features, relative to their RMS"})
    unroll: int = field(default=2, metadata={"help": "eagle, eagle3: drafting steps unrolled in training (1: teacher "
                                                     "forcing only; 2-3 feed predicted features back)"})
    feature_weight: float = field(default=1.0, metadata={"help": "eagle: weight of the feature regression "
                                                                 "(smooth L1) next to the token cross entropy "
                                                                 "(eagle3 regresses none)"})
    export: str | None = field(default=None, metadata={
        "help": f"also write the trained drafter in an engine's format ({', '.join(EXPORT_FORMATS)}) to "
                f"OUT/export-FORMAT (as `specwise export-drafter OUT --format FORMAT` does)"})
    init_from_target: bool = field(default=False, metadata={
        "help": "eagle: start the head's decoder layer from the target's last one (measured on SmolLM2-135M: "
                "worse than a random start)"})

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ConfigError(f"--kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not self.out:
            raise ConfigError("--out is required: the directory to write the drafter to")
        if self.export is not None and self.export not in EXPORT_FORMATS:
            raise ConfigError(f"--export must be one of {', '.join(EXPORT_FORMATS)}, got {self.export!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not 0 <= self.held_out < 1:
            raise ConfigError(f"--held-out must be in [0, 1), got {self.held_out}")
        if self.temperature < 0:
            raise ConfigError(f"--temperature must be >= 0, got {self.temperature}")
        for name in ("max_tokens", "generation_batch", "corpus_tokens", "epochs", "batch_tokens", "checkpoint_every",
                     "eval_stride", "num_heads", "draft_layers", "unroll"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.eval_k <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(f"--eval-k must be in 1..{MAX_SPECULATIVE_TOKENS}, got {self.eval_k}")
        if self.kind == "medusa" and self.eval_k > self.num_heads:
            raise ConfigError(f"--eval-k {self.eval_k} exceeds --num-heads {self.num_heads}: medusa drafts at most "
                              f"one token per head")
        if self.lr <= 0 or self.clip <= 0 or self.weight_decay < 0 or self.feature_noise < 0 or self.feature_weight < 0:
            raise ConfigError("--lr and --clip must be > 0; --weight-decay, --feature-noise, --feature-weight >= 0")
        if self.num_threads is not None and self.num_threads < 1:
            raise ConfigError(f"--num-threads must be >= 1, got {self.num_threads}")


@dataclass
class ExportConfig:
    """`specwise export-drafter DRAFTER --format FORMAT --out OUT`."""
    drafter: str = field(default="", metadata={"help": "the drafter directory train-drafter wrote"})
    format: str = field(default="vllm", metadata={"help": f"the engine whose checkpoint format to write: "
                                                          f"{', '.join(EXPORT_FORMATS)}"})
    out: str = field(default="", metadata={"help": "directory to write (new, or empty)"})
    target: str | None = field(default=None, metadata={
        "help": "the target the drafter was trained for: HF directory or GGUF file; default: embedded "
                "SmolLM2-135M-Instruct"})

    def __post_init__(self):
        if not self.drafter:
            raise ConfigError("the drafter directory is required: specwise export-drafter DIR --out OUT")
        if self.format not in EXPORT_FORMATS:
            raise ConfigError(f"--format must be one of {', '.join(EXPORT_FORMATS)}, got {self.format!r}")
        if not self.out:
            raise ConfigError("--out is required: the directory to write the exported drafter to")
