"""The step-cost model: how long one forward pass takes, for the calculators, the simulator,
the adaptive speculation policy and calibration alike.

A decode (or verification) step runs `batch_size` sequences with `tokens_per_seq` new
tokens each (1 without speculation, 1 + k when verifying k drafts) over KV caches
that already hold `context_lens` tokens. A prefill step runs whole prompts.

Two implementations: `RooflineCost` (catalog figures, calc/roofline.py) and
`ProfileCost` (a measured grid, engine/cost/step_profile.py).
"""

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from specwise.errors import ConfigError


class StepCostModel(ABC):
    description: str = ""

    @abstractmethod
    def step_times(self, batch_size: int, tokens_per_seq: int, total_context) -> np.ndarray:
        """Seconds for each of several candidate steps of the same shape.

        total_context: array [num_steps], KV tokens already cached, summed over the batch.
        Returns an array [num_steps]. The simulator calls this once per run of steps.
        """

    @abstractmethod
    def prefill_time(self, prompt_lens: Sequence[int]) -> float:
        """Seconds to prefill these prompts together in one step."""

    def step_time(self, batch_size: int, tokens_per_seq: int, context_lens) -> float:
        """One step; context_lens is a list (one per sequence) or one length shared by all."""
        check_step_shape(batch_size, tokens_per_seq)
        if np.ndim(context_lens) == 0:
            total = float(context_lens) * batch_size
        else:
            if len(context_lens) != batch_size:
                raise ConfigError(f"context_lens has {len(context_lens)} entries for batch_size {batch_size}")
            total = float(np.sum(context_lens))
        return float(self.step_times(batch_size, tokens_per_seq, np.array([total]))[0])


def attention_pairs(new_tokens, cached_tokens):
    """(query, key) pairs a sequence's attention computes when it is fed `new_tokens` rows after
    `cached_tokens` cached ones: each row attends to every cached token and, causally, to itself and
    the rows fed before it, so new x cached + new (new + 1) / 2. The one count of attention work for
    every step-cost model (the roofline's FLOPs, the linear model's feature). Numbers or arrays
    (elementwise). Worked example: a 100-token prompt chunk after 50 cached tokens computes
    5,000 + 5,050 = 10,050 pairs; a decode row over 300 cached tokens 301; a verification of 1 + 4
    rows over 300, 1,515. A draft tree's rows count as a chain of as many rows (its mask hides a
    few of the pairs among them; they are few beside the cache's)."""
    new = np.asarray(new_tokens, dtype=float)
    return new * np.asarray(cached_tokens, dtype=float) + new * (new + 1) / 2


def check_step_shape(batch_size: int, tokens_per_seq: int) -> None:
    if batch_size < 1 or tokens_per_seq < 1:
        raise ConfigError(f"batch_size and tokens_per_seq must be >= 1, got {batch_size} and {tokens_per_seq}")
