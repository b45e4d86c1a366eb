"""Steady-state serving throughput against batch size, with and without speculation.

At batch size B, every sequence sits on average at context L = prompt + output / 2.
Without speculation the server emits B tokens per decode step; with k drafts it emits
B x E(k) tokens per (verification over 1 + k tokens + drafting + overhead). Prefill is
left out: this is the decode-phase rate a continuous-batching server settles into.
The largest batch is what the KV cache holds at prompt + output (+ k lookahead) tokens
per sequence; the table stops there.

Why speculation stops paying: at small B a step is bound by reading the weights, so
verifying 1 + k tokens costs about what 1 does. As B grows the step turns compute-bound
and verifying costs (1 + k)x. With long contexts the KV-cache read (which does not grow
with k) dominates the step again, so speculation pays again at large B (MagicDec), the
more so with a drafter whose KV read is capped.
"""

from dataclasses import dataclass, field

import numpy as np

from specwise.calc.arms import MODEL_FREE, SpecArm, build_arm
from specwise.calc.deployment import Deployment
from specwise.engine.cost.step_cost import StepCostModel
from specwise.engine.spec_decode.config import SpeculativeConfig
from specwise.errors import ConfigError


@dataclass
class ThroughputConfig:
    prompt_tokens: int = field(default=1024, metadata={"help": "prompt length, tokens"})
    output_tokens: int = field(default=256, metadata={"help": "output length, tokens"})
    method: str = field(default="draft", metadata={"help": "name of the drafting method (labels only)"})
    k: int = field(default=4, metadata={"help": "draft tokens per step"})
    alpha: float | None = field(default=None, metadata={"help": "i.i.d. acceptance probability per draft token"})
    positions: str | None = field(default=None, metadata={
        "help": "measured per-position acceptance instead of alpha, e.g. 0.8/0.62/0.48"})
    drafter: str | None = field(default=None, metadata={
        "help": "draft model (catalog name or config.json) on the same GPUs"})
    draft_cost: float | None = field(default=None, metadata={
        "help": "instead of --drafter: one draft token's cost relative to a target decode step"})
    draft_kv_budget: int | None = field(default=None, metadata={
        "help": "drafter attends to at most this many cached tokens (MagicDec-style)"})
    spec_overhead_ms: float = field(default=0.0, metadata={"help": "fixed cost per verification step, ms"})
    lookahead: str | None = field(default=None, metadata={
        "help": "with --method lookahead: its sizes W,N,G (default: the engine's); --k is its prompt-lookup "
                "candidate's length, and a step feeds 1 + (W + G)(N - 1) + max(0, k - (N - 1)) tokens per "
                "sequence"})
    batch_sizes: str | None = field(default=None, metadata={
        "help": "batch sizes to tabulate, e.g. 1,8,64 (default: powers of 2 up to the KV limit)"})
    max_num_seqs: int = field(default=1024, metadata={"help": "largest batch the server allows"})

    def __post_init__(self):
        for name in ("prompt_tokens", "output_tokens", "k", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")

    def arm(self, target: StepCostModel, deployment: Deployment) -> SpecArm:
        keys = {"k": str(self.k), "overhead_ms": str(self.spec_overhead_ms)}
        if self.method == "lookahead":
            sizes = SpeculativeConfig.parse(f"lookahead:{self.lookahead}" if self.lookahead else "lookahead", self.k)
            keys.update(w=str(sizes.lookahead_window), n=str(sizes.lookahead_ngram), g=str(sizes.lookahead_candidates))
        elif self.lookahead is not None:
            raise ConfigError("--lookahead W,N,G applies to --method lookahead only")
        for key, value in (("alpha", self.alpha), ("positions", self.positions), ("drafter", self.drafter),
                           ("cost", self.draft_cost), ("budget", self.draft_kv_budget)):
            if value is not None:
                keys[key] = str(value).replace(",", "/")
        if self.drafter is None and self.draft_cost is None and self.method not in MODEL_FREE + ("lookahead",):
            raise ConfigError("say what drafting costs: --drafter MODEL or --draft-cost FRACTION")
        return build_arm(self.method, keys, target, deployment)

    def batch_list(self) -> list[int] | None:
        if self.batch_sizes is None:
            return None
        try:
            sizes = sorted({int(part) for part in self.batch_sizes.split(",") if part.strip()})
        except ValueError:
            raise ConfigError(f"--batch-sizes must be integers separated by commas, got {self.batch_sizes!r}")
        if not sizes or sizes[0] < 1:
            raise ConfigError("--batch-sizes must be >= 1")
        return sizes


@dataclass(frozen=True)
class ThroughputRow:
    batch_size: int
    off_tokens_per_s: float
    spec_tokens_per_s: float
    off_step_s: float
    spec_step_s: float
    bound: str | None          # the plain decode step: "memory" or "compute" (roofline only)

    @property
    def ratio(self) -> float:
        return self.spec_tokens_per_s / self.off_tokens_per_s


def decode_rates(cost: StepCostModel, arm: SpecArm, batch_size: int, context_len: float) -> ThroughputRow:
    """Tokens per second at one batch size, every sequence at `context_len` cached tokens."""
    if not arm.speculative or not arm.policy.is_fixed:
        raise ConfigError("the throughput calculator takes one speculative arm with a fixed k")
    k = arm.k_for(batch_size)
    total = np.array([batch_size * float(context_len)])
    off_step = float(cost.step_times(batch_size, 1, total)[0])
    budget = arm.draft.kv_budget
    capped = total if budget is None else np.array([batch_size * float(min(context_len, budget))])
    spec_step = float(cost.step_times(batch_size, k + 1, total)[0]
                      + arm.draft.draft_times(batch_size, k, total, capped)[0] + arm.overhead_s)
    tokens = arm.acceptance["*"].expected_tokens(k)
    bound = getattr(cost, "bound", None)
    return ThroughputRow(batch_size=batch_size, off_tokens_per_s=batch_size / off_step,
                         spec_tokens_per_s=batch_size * tokens / spec_step, off_step_s=off_step,
                         spec_step_s=spec_step, bound=bound(batch_size, 1, context_len) if bound else None)


def max_batch(deployment: Deployment, arm: SpecArm, prompt: int, output: int, max_num_seqs: int) -> int:
    """Most sequences of this length the KV cache holds (drafter weights and KV included)."""
    budget = arm.draft.kv_budget
    fraction = 1.0 if budget is None else min(1.0, budget / (prompt + output))
    plan = deployment.memory_plan(arm.drafter, fraction)
    per_sequence = prompt + output + arm.policy.max_k
    return min(max_num_seqs, plan.kv_capacity_tokens // per_sequence)


def batch_grid(limit: int) -> list[int]:
    """1, 2, 4, ... up to the limit, and the limit itself."""
    sizes = [1 << n for n in range(limit.bit_length()) if 1 << n <= limit]
    return sizes + ([limit] if limit not in sizes else [])


def throughput_table(cost: StepCostModel, arm: SpecArm, context_len: float, batch_sizes) -> list[ThroughputRow]:
    return [decode_rates(cost, arm, batch, context_len) for batch in batch_sizes]


def switches(cost: StepCostModel, arm: SpecArm, context_len: float,
             rows: list[ThroughputRow]) -> list[tuple[int, bool]]:
    """Batch sizes where speculation starts (True) or stops (False) paying, each found exactly by
    bisection between neighbouring rows of the table."""
    found = []
    for previous, row in zip(rows, rows[1:]):
        pays = row.ratio >= 1.0
        if pays == (previous.ratio >= 1.0):
            continue
        low, high = previous.batch_size, row.batch_size          # status of low differs from high's
        while high - low > 1:
            mid = (low + high) // 2
            if (decode_rates(cost, arm, mid, context_len).ratio >= 1.0) == pays:
                high = mid
            else:
                low = mid
        found.append((high, pays))
    return found


def crossover(cost: StepCostModel, arm: SpecArm, context_len: float, rows: list[ThroughputRow]) -> int | None:
    """The batch size at which speculation stops paying (None: it does not stop within the table)."""
    if rows and rows[0].ratio < 1.0:
        return rows[0].batch_size
    return next((batch for batch, pays in switches(cost, arm, context_len, rows) if not pays), None)


def describe_switches(rows: list[ThroughputRow], changes: list[tuple[int, bool]]) -> str:
    if not rows:
        return "no batch size fits"
    start = "pays" if rows[0].ratio >= 1.0 else "loses"
    if not changes:
        return f"speculation {start} at every batch size in the table"
    parts = [f"speculation {start} from batch size {rows[0].batch_size}"]
    parts += [f"{'pays' if pays else 'stops paying'} from {batch}" for batch, pays in changes]
    return ", ".join(parts)
