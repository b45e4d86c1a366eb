"""k by batch size: the one table behind `--speculative-policy table:...`, the calculators' and
simulator's `policy=...` arms, and vLLM's `num_speculative_tokens_per_batch_size`.

Text form: BATCH=K pairs joined by '/', batch sizes increasing from 1; each pair sets k from
that batch size up to the next pair's. It has no commas, so it fits both on the command line
(`--speculative-policy table:1=4/8=2/32=0`) and inside a comma-separated arm
(`draft:policy=1=4/8=2/32=0,alpha=0.8`).

Worked example, KTable.parse("1=4/8=2/32=0"):
    batch size   1..7   8..31   32 and up
    k_for        4      2       0 (speculation off)
    to_vllm_ranges(64) == [[1, 7, 4], [8, 31, 2], [32, 64, 0]]
"""

from dataclasses import dataclass

from specwise.engine.spec_decode.config import MAX_SPECULATIVE_TOKENS
from specwise.errors import ConfigError

FORM = "BATCH=K pairs joined by '/', from batch 1, e.g. 1=4/8=2/32=0"


@dataclass(frozen=True)
class KTable:
    steps: tuple[tuple[int, int], ...]       # (smallest batch size, k), batch sizes increasing from 1

    def __post_init__(self):
        batches = [batch for batch, _ in self.steps]
        if not batches or batches[0] != 1 or batches != sorted(set(batches)):
            raise ConfigError(f"k table {self.to_text()!r}: batch sizes must start at 1 and increase ({FORM})")
        if any(not 0 <= k <= MAX_SPECULATIVE_TOKENS for _, k in self.steps):
            raise ConfigError(f"k table {self.to_text()!r}: k must be in 0..{MAX_SPECULATIVE_TOKENS}")

    @classmethod
    def fixed(cls, k: int) -> "KTable":
        return cls(((1, k),))

    @classmethod
    def parse(cls, text: str) -> "KTable":
        """"1=4/8=2/32=0" -> KTable(((1, 4), (8, 2), (32, 0)))."""
        try:
            steps = tuple(tuple(int(part) for part in item.split("=")) for item in text.split("/"))
            if any(len(step) != 2 for step in steps):
                raise ValueError
        except ValueError:
            raise ConfigError(f"k table {text!r}: expected {FORM}") from None
        return cls(steps)

    def k_for(self, batch_size: int) -> int:
        return [k for batch, k in self.steps if batch <= max(batch_size, 1)][-1]

    @property
    def max_k(self) -> int:
        return max(k for _, k in self.steps)

    @property
    def is_fixed(self) -> bool:
        return len(self.steps) == 1

    def to_text(self) -> str:
        return "/".join(f"{batch}={k}" for batch, k in self.steps)

    def to_vllm_ranges(self, max_batch: int) -> list[list[int]]:
        """[[lo, hi, k], ...]: each step up to the next one's batch size - 1, the last up to
        max_batch (or its own batch size, if larger)."""
        ends = [batch - 1 for batch, _ in self.steps[1:]] + [max(max_batch, self.steps[-1][0])]
        return [[lo, hi, k] for (lo, k), hi in zip(self.steps, ends)]
