"""What drafting costs (how many drafts at each batch size: engine/spec_decode/k_table.py).

DraftCost gives the seconds to propose k tokens for every sequence of a batch:
  NoDraftCost        n-gram prompt lookup: no GPU work (its CPU time goes in the arm's overhead)
  RelativeDraftCost  each draft token costs `cost` x one target decode step (EAGLE/Medusa heads, what-ifs)
  ExtraRowsCost      rows fed beside the k verified drafts in the same forward (lookahead decoding's
                     Jacobi window and its other candidates): the step's growth from 1 + k to
                     1 + (W + G)(N - 1) tokens per sequence
  ModelDraftCost     a draft model on the same GPUs, run k times autoregressively; with
                     `kv_budget` it attends to at most that many cached tokens per sequence
                     (MagicDec's StreamingLLM-style self-speculation)
"""

from abc import ABC, abstractmethod

import numpy as np

from specwise.engine.cost.step_cost import StepCostModel
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


class ExtraRowsCost(DraftCost):
    """A step that verifies k drafts but feeds `rows` positions after each sequence's last token
    (lookahead: rows = (W + G)(N - 1), k = N - 1): the extra rows cost what they add to the forward."""

    def __init__(self, target: StepCostModel, rows: int):
        if rows < 1:
            raise ConfigError(f"rows per step must be >= 1, got {rows}")
        self.target, self.rows = target, rows
        self.description = f"{rows} rows per sequence in the verification forward (lookahead)"

    def draft_times(self, batch_size, k, total_context, budget_context) -> np.ndarray:
        if k == 0 or self.rows <= k:
            return np.zeros(np.shape(total_context))
        return (self.target.step_times(batch_size, 1 + self.rows, total_context)
                - self.target.step_times(batch_size, 1 + k, total_context))

    def prefill_time(self, prompt_lens) -> float:
        return 0.0


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
