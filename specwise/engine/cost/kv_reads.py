"""How a server's attention reads the KV cache: the step-cost model's "KV tokens read".

A paged-attention kernel that walks each sequence's own blocks (vLLM's, FlashAttention's) reads
about its cached tokens. Ours (models/attention.py) batches the reads: sequences fed the same
number of rows are sorted by context length and attended to in groups of up to `group_size`, each
member read to its group's longest context, in whole blocks of `block_size` (the tail past its own
context masked, computed all the same). A prompt chunk from position 0 reads no cache. So a step
whose sequences hold very different contexts reads more than their sum:

    KV tokens read = cached tokens + padding,
    padding = sum over groups, over members, of (group's context in whole blocks - own context)

where a sequence's context is its cached tokens plus the rows it is fed (they are written to the
cache before the attention reads it). Worked example, groups of 2, blocks of 16, four decodes over
10, 50, 20 and 30 cached tokens (contexts 11, 51, 21, 31): sorted 11, 21 | 31, 51; the first group
reads 2 x 32, the second 2 x 64: padding (32 - 11) + (32 - 21) + (64 - 31) + (64 - 51) = 78, KV
tokens read 110 + 78 = 188.

Why it matters: a calibration wave's sequences hold about the same context, so its steps pad
little, while a served mix of short and long requests pads a lot (our server at concurrency 16 on
the suite's prompts: a decode step read 2.0x its cached tokens), and batch 64 is four groups where
waves of 1-16 are one. Logged at the engine (docs/calculators.md), a fit of our server's own sweep
steps predicted its evaluation's steps with a median error of 8.4% counting each sequence's own
tokens, 4.9% counting them as read with a cost a group. `specwise serve` says its layout on
/health; `calibrate --endpoint` counts the waves' KV that way, the profile keeps it, and the
simulator counts its steps the same way (engine/cost/linear_cost.py StepShape.of).
"""

import math
from dataclasses import asdict, dataclass

from specwise.errors import ConfigError


@dataclass(frozen=True)
class KVReads:
    group_size: int        # sequences attended to together (the same number of rows each, sorted by context)
    block_size: int        # a read covers whole blocks of this many tokens

    def __post_init__(self):
        if self.group_size < 1 or self.block_size < 1:
            raise ConfigError(f"KV reads need a group size and a block size of at least 1, got "
                              f"{self.group_size}/{self.block_size}")

    def read(self, new_tokens, cached_tokens) -> tuple[float, int]:
        """(KV tokens read past the sequences' own contexts, groups read) of one step: sequence i fed
        new_tokens[i] rows after cached_tokens[i] cached ones. Rows of a speculating server's calibration
        wave are a mean per step (2.4, say): rounded to a whole count, which is how they group most steps."""
        contexts: dict[int, list[float]] = {}
        for new, cached in zip(new_tokens, cached_tokens):
            if cached > 0:
                contexts.setdefault(round(new), []).append(float(cached + new))
        padding, groups = 0.0, 0
        for same_rows in contexts.values():
            same_rows.sort()
            for start in range(0, len(same_rows), self.group_size):
                group = same_rows[start:start + self.group_size]
                read = math.ceil(group[-1] / self.block_size) * self.block_size
                padding, groups = padding + sum(read - context for context in group), groups + 1
        return padding, groups

    def padding(self, new_tokens, cached_tokens) -> float:
        return self.read(new_tokens, cached_tokens)[0]

    def groups(self, new_tokens, cached_tokens) -> int:
        """Each group is a fixed cost of its own ops, every layer."""
        return self.read(new_tokens, cached_tokens)[1]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data) -> "KVReads | None":
        """{"group_size": G, "block_size": B} -> KVReads; None (or anything else) -> None: each sequence reads
        its own cache."""
        if not isinstance(data, dict):
            return None
        group, block = data.get("group_size"), data.get("block_size")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in (group, block)):
            return None
        return cls(group, block)

    @classmethod
    def parse(cls, text: str) -> "KVReads | None":
        """--kv-reads GROUP/BLOCK ("16/16"), or "none": each sequence reads its own cache."""
        if text.strip().lower() == "none":
            return None
        group, _, block = text.partition("/")
        try:
            return cls(int(group), int(block))
        except ValueError:
            raise ConfigError(f"--kv-reads takes GROUP/BLOCK (e.g. 16/16) or none, got {text!r}") from None

    def text(self) -> str:
        """The --kv-reads grammar: "16/16"."""
        return f"{self.group_size}/{self.block_size}"

    def describe(self) -> str:
        return f"KV read in groups of {self.group_size} to the longest, blocks of {self.block_size}"
