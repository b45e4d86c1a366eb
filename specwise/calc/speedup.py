"""Speculative decoding speedup at batch size 1, in units of one target forward pass.

One verification step with k drafts costs
    1 + k x (draft_cost + verify_cost) + overhead
target forwards and emits E(k) = 1 + p_1 + ... + p_k tokens; plain decoding emits one
token per forward, so speedup(k) = E(k) / cost(k). With verify_cost = overhead = 0
this is Leviathan et al.'s (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)).

Worked example: alpha = 0.8, k = 4, a drafter at 5% of the target (c = 0.05):
E = (1 - 0.8^5) / 0.2 = 3.3616 tokens, cost = 1.2, speedup = 2.80x. Speculation
at k = 4 loses below alpha = 0.167, where E(alpha) falls to 1.2.
"""

from dataclasses import dataclass, field

from specwise.calc.acceptance import Acceptance, expected_tokens_per_step
from specwise.errors import ConfigError


@dataclass
class SpeedupConfig:
    alpha: float | None = field(default=None, metadata={
        "help": "i.i.d. acceptance probability of each draft token (Leviathan's alpha)"})
    positions: str | None = field(default=None, metadata={
        "help": "measured per-position acceptance instead of alpha, e.g. 0.8,0.62,0.48"})
    k: int | None = field(default=None, metadata={"help": "draft tokens per step to report on (default: best k)"})
    k_max: int = field(default=10, metadata={"help": "largest k in the table"})
    draft_cost: float = field(default=0.0, metadata={
        "help": "cost of one draft token relative to one target forward (c)"})
    overhead: float = field(default=0.0, metadata={
        "help": "fixed cost per verification step relative to one target forward"})
    verify_cost: float = field(default=0.0, metadata={
        "help": "extra target cost per extra verified token, relative (0 = memory-bound)"})

    def __post_init__(self):
        for name in ("draft_cost", "overhead", "verify_cost"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.k_max < 1 or (self.k is not None and self.k < 1):
            raise ConfigError("k and k_max must be >= 1")

    def acceptance(self) -> Acceptance:
        if self.positions is None:
            if self.alpha is None:
                raise ConfigError("give --alpha or --positions")
            return Acceptance(alpha=self.alpha)
        if self.alpha is not None:
            raise ConfigError("give --alpha or --positions, not both")
        try:
            rates = tuple(float(p) for p in self.positions.replace("/", ",").split(",") if p.strip())
        except ValueError:
            raise ConfigError(f"--positions must be numbers separated by commas, got {self.positions!r}") from None
        return Acceptance(positions=rates)


@dataclass(frozen=True)
class SpeedupRow:
    k: int
    tokens_per_step: float
    acceptance_rate: float        # accepted / drafted
    relative_cost: float          # target forwards per verification step
    speedup: float
    breakeven_alpha: float | None  # i.i.d. alpha below which this k loses; None: never pays


def step_cost(k: int, draft_cost: float, overhead: float = 0.0, verify_cost: float = 0.0) -> float:
    return 1.0 + k * (draft_cost + verify_cost) + overhead


def speedup(acceptance: Acceptance, k: int, draft_cost: float, overhead: float = 0.0,
            verify_cost: float = 0.0) -> float:
    return acceptance.expected_tokens(k) / step_cost(k, draft_cost, overhead, verify_cost)


def breakeven_alpha(k: int, draft_cost: float, overhead: float = 0.0, verify_cost: float = 0.0) -> float | None:
    """Smallest i.i.d. alpha at which k drafts per step are no slower than plain decoding."""
    cost = step_cost(k, draft_cost, overhead, verify_cost)
    if cost <= 1.0:
        return 0.0
    if cost >= k + 1:
        return None
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if expected_tokens_per_step(mid, k) < cost:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def speedup_table(acceptance: Acceptance, k_max: int, draft_cost: float, overhead: float = 0.0,
                  verify_cost: float = 0.0) -> list[SpeedupRow]:
    k_max = min(k_max, acceptance.max_k or k_max)
    return [SpeedupRow(k=k, tokens_per_step=acceptance.expected_tokens(k),
                       acceptance_rate=acceptance.acceptance_rate(k),
                       relative_cost=step_cost(k, draft_cost, overhead, verify_cost),
                       speedup=speedup(acceptance, k, draft_cost, overhead, verify_cost),
                       breakeven_alpha=breakeven_alpha(k, draft_cost, overhead, verify_cost))
            for k in range(1, k_max + 1)]


def best_row(rows: list[SpeedupRow]) -> SpeedupRow:
    """Highest speedup; the smaller k on ties."""
    return max(rows, key=lambda row: (round(row.speedup, 12), -row.k))


def minimum_alpha(k_max: int, draft_cost: float, overhead: float = 0.0, verify_cost: float = 0.0) -> float | None:
    """Below this i.i.d. alpha no k up to k_max pays. Without a fixed overhead k = 1 decides
    (each extra draft adds alpha^k <= alpha tokens for the same extra cost), giving Leviathan et
    al.'s condition alpha > c; a fixed overhead can make longer drafts pay where k = 1 does not."""
    values = [breakeven_alpha(k, draft_cost, overhead, verify_cost) for k in range(1, k_max + 1)]
    values = [value for value in values if value is not None]
    return min(values) if values else None
