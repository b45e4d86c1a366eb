"""How many draft tokens to verify in the next step: static, a batch-size table (k_table.py), or auto.

Speculation trades extra verification work for fewer steps. At batch 1 the target is
memory-bound and verifying 1 + k tokens costs little more than 1; as the batch grows the
step becomes compute-bound and each rejected draft token is paid in full. `auto` picks,
every step, the k that maximises expected tokens per second for the current batch:

    tokens/s(k) = batch_size * E[tokens per step | k] / (verify_time(batch, 1 + k) + draft_time(batch, k))
    E[tokens per step | k] = 1 + sum_{j=1..k} prod_{i<j} c_i

where c_i is the measured probability that draft position i is accepted given that
positions 0..i-1 were (recent steps weigh more), verify_time comes from a step-cost
profile (`specwise calibrate`, or measured at start-up) and draft_time is measured
online. k = 0 turns speculation off; while it is off, one step in `explore_every`
still drafts so the acceptance estimate follows the traffic.

Worked example: c = [0.8, 0.6], verify_time(1, 1) = 40 ms, verify_time(1, 3) = 50 ms,
no drafting cost. k=0: 1 / 0.040 = 25 tok/s. k=2: (1 + 0.8 + 0.48) / 0.050 = 45.6 tok/s.
At batch 64 with verify_time(64, 1) = 400 ms and verify_time(64, 3) = 1300 ms:
k=0: 160 tok/s; k=2: 64 * 2.28 / 1.3 = 112 tok/s, so auto turns speculation off.

A draft-tree proposer's k counts rows, not draft positions (lookahead 2,3,2 at k 4: 10 rows
verify at most 4 positions). It names the budgets auto chooses among and the positions
each verifies (`auto_levels`, e.g. [(0, 0), (10, 4)]): tokens per step come from the
positions, the step's cost from the rows. Lookahead offers off and its full size, since what
a smaller window or fewer candidates would accept is not measured; a `table:` policy shrinks
W and G by batch size instead (k = rows, e.g. table:1=10/4=6/16=0).
"""

from dataclasses import dataclass, field
from typing import Callable

from specwise.engine.spec_decode.k_table import KTable
from specwise.errors import ConfigError

StepCost = Callable[[int, int, int], float]   # (batch_size, tokens_per_seq, context_len) -> seconds


@dataclass
class StaticPolicy:
    k: int

    def choose_k(self, batch_size: int, context_len: int) -> int:
        return self.k

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        pass

    def observe_drafting(self, seconds: float, batch_size: int, k: int) -> None:
        pass


@dataclass
class TablePolicy(StaticPolicy):
    """`table:1=4/8=2/32=0` (k_table.py): k 4 from batch 1, 2 from batch 8, off from batch 32."""
    table: KTable = field(default_factory=lambda: KTable.fixed(0))

    @classmethod
    def parse(cls, text: str, max_k: int) -> "TablePolicy":
        table = KTable.parse(text)
        if table.max_k > max_k:
            raise ConfigError(f"table:{text} asks for k = {table.max_k}, above --num-speculative-tokens {max_k}")
        return cls(k=max_k, table=table)

    def choose_k(self, batch_size: int, context_len: int) -> int:
        return self.table.k_for(batch_size)


@dataclass
class AutoPolicy:
    max_k: int
    verify_time: StepCost
    prior_acceptance: float = 0.5       # c_i before any measurement, weighted as `prior_weight` drafts
    prior_weight: float = 4.0
    decay: float = 0.99                 # per observed draft: the last few hundred drafts dominate
    explore_every: int = 32
    reached: list[float] = field(default_factory=list)     # [i]: drafts that reached position i
    accepted: list[float] = field(default_factory=list)    # [i]: of those, accepted at i
    draft_seconds_per_token: dict[int, float] = field(default_factory=dict)   # batch bucket -> seconds
    steps_off: int = 0
    levels: list[tuple[int, int]] | None = None    # (k, positions it verifies); None: every k, k positions

    def __post_init__(self):
        self.reached = [0.0] * self.max_k
        self.accepted = [0.0] * self.max_k

    def conditional_acceptance(self) -> list[float]:
        return [(accepted + self.prior_acceptance * self.prior_weight) / (reached + self.prior_weight)
                for reached, accepted in zip(self.reached, self.accepted)]

    def expected_tokens(self, k: int) -> float:
        expected, reach = 1.0, 1.0
        for rate in self.conditional_acceptance()[:k]:
            reach *= rate
            expected += reach
        return expected

    def tokens_per_second(self, k: int, batch_size: int, context_len: int, positions: int | None = None) -> float:
        seconds = self.verify_time(batch_size, 1 + k, context_len) + self.draft_time(batch_size, k)
        return batch_size * self.expected_tokens(k if positions is None else positions) / max(seconds, 1e-9)

    def choose_k(self, batch_size: int, context_len: int) -> int:
        levels = self.levels or [(k, k) for k in range(self.max_k + 1)]
        best = max(levels, key=lambda level: self.tokens_per_second(*level[:1], batch_size, context_len,
                                                                     level[1]))[0]
        self.steps_off = self.steps_off + 1 if best == 0 else 0
        if self.steps_off >= self.explore_every:
            self.steps_off = 0
            return self.max_k
        return best

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        """One sequence's verification: positions 0..num_accepted reached, 0..num_accepted-1 accepted."""
        for position in range(min(num_drafted, self.max_k)):
            self.reached[position] *= self.decay
            self.accepted[position] *= self.decay
            if position <= num_accepted:
                self.reached[position] += 1
                self.accepted[position] += position < num_accepted

    def observe_drafting(self, seconds: float, batch_size: int, k: int) -> None:
        if k <= 0:
            return
        bucket = _bucket(batch_size)
        per_token = seconds / k
        previous = self.draft_seconds_per_token.get(bucket, per_token)
        self.draft_seconds_per_token[bucket] = 0.8 * previous + 0.2 * per_token

    def draft_time(self, batch_size: int, k: int) -> float:
        if k == 0 or not self.draft_seconds_per_token:
            return 0.0
        bucket = min(self.draft_seconds_per_token, key=lambda known: abs(known - _bucket(batch_size)))
        return k * self.draft_seconds_per_token[bucket] * batch_size / bucket


def _bucket(batch_size: int) -> int:
    return 1 << max(0, batch_size - 1).bit_length()
