"""What drafting costs, and how many drafts to ask for at each batch size.

DraftCost gives the seconds to propose k tokens for every sequence of a batch:
  NoDraftCost        n-gram prompt lookup: no GPU work (its CPU time goes in the arm's overhead)
  RelativeDraftCost  each draft token costs `cost` x one target decode step (EAGLE/Medusa heads, what-ifs)
  ModelDraftCost     a draft model on the same GPUs, run k times autoregressively; with
                     `kv_budget` it attends to at most that many cached tokens per sequence
                     (MagicDec's StreamingLLM-style self-speculation)

KPolicy maps the batch size of a step to k, e.g. "1-5/32-3/128-0": k = 5 from batch 1,
3 from batch 32, off from batch 128.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from specwise.engine.step_cost import StepCostModel
from specwise.errors import ConfigError


class DraftCost(ABC):
    kv_budget: int | None = None
    description: str = ""

    @abstractmethod
    def draft_times(self, batch_size: int, k: int, total_context, budget_context) -> np.ndarray:
        """Seconds to draft k tokens for each sequence, for several candidate steps.

        total_context, budget_context: arrays [num_steps] of cached tokens summed over the batch,
        the second with each sequence capped at kv_budget (equal to the first without a budget).
        """

    @abstractmethod
    def prefill_time(self, prompt_lens) -> float:
        """Extra prefill seconds the drafter adds when prompts are admitted."""


class NoDraftCost(DraftCost):
    description = "free drafts (prompt lookup)"

    def draft_times(self, batch_size, k, total_context, budget_context) -> np.ndarray:
        return np.zeros(np.shape(total_context))

    def prefill_time(self, prompt_lens) -> float:
        return 0.0


class RelativeDraftCost(DraftCost):
    def __init__(self, target: StepCostModel, cost: float):
        if cost < 0:
            raise ConfigError(f"relative draft cost must be >= 0, got {cost}")
        self.target, self.cost = target, cost
        self.description = f"each draft token = {cost:g} x a target decode step"

    def draft_times(self, batch_size, k, total_context, budget_context) -> np.ndarray:
        if k == 0 or self.cost == 0:
            return np.zeros(np.shape(total_context))
        return self.cost * k * self.target.step_times(batch_size, 1, total_context)

    def prefill_time(self, prompt_lens) -> float:
        return self.cost * self.target.prefill_time(prompt_lens) if self.cost else 0.0


class ModelDraftCost(DraftCost):
    def __init__(self, drafter: StepCostModel, kv_budget: int | None = None, name: str = "draft model"):
        if kv_budget is not None and kv_budget < 1:
            raise ConfigError(f"drafter KV budget must be >= 1 token, got {kv_budget}")
        self.drafter, self.kv_budget = drafter, kv_budget
        budget = f", KV budget {kv_budget} tokens" if kv_budget else ""
        self.description = f"{name}, k autoregressive forwards{budget}"

    def draft_times(self, batch_size, k, total_context, budget_context) -> np.ndarray:
        if k == 0:
            return np.zeros(np.shape(total_context))
        return k * self.drafter.step_times(batch_size, 1, budget_context)

    def prefill_time(self, prompt_lens) -> float:
        return self.drafter.prefill_time(prompt_lens)


@dataclass(frozen=True)
class KPolicy:
    steps: tuple[tuple[int, int], ...]       # (smallest batch size, k), increasing batch sizes

    def __post_init__(self):
        batches = [batch for batch, _ in self.steps]
        if not self.steps or batches[0] != 1 or batches != sorted(set(batches)):
            raise ConfigError(f"k policy must start at batch size 1 with increasing batch sizes, got {self.steps}")
        if any(k < 0 or k > 32 for _, k in self.steps):
            raise ConfigError(f"k must be in 0..32, got {self.steps}")

    @classmethod
    def fixed(cls, k: int) -> "KPolicy":
        return cls(((1, k),))

    @classmethod
    def parse(cls, text: str) -> "KPolicy":
        """"1-5/32-3/128-0" -> k = 5 from batch 1, 3 from 32, 0 from 128."""
        try:
            steps = tuple(tuple(int(part) for part in item.split("-")) for item in text.split("/"))
            if any(len(step) != 2 for step in steps):
                raise ValueError
        except ValueError:
            raise ConfigError(f"k policy {text!r}: expected BATCH-K pairs separated by '/', "
                              "e.g. 1-5/32-3/128-0") from None
        return cls(steps)

    def k_for(self, batch_size: int) -> int:
        k = self.steps[0][1]
        for batch, value in self.steps:
            if batch_size >= batch:
                k = value
        return k

    @property
    def max_k(self) -> int:
        return max(k for _, k in self.steps)

    @property
    def is_fixed(self) -> bool:
        return len(self.steps) == 1

    def describe(self) -> str:
        return "/".join(f"{batch}-{k}" for batch, k in self.steps)
