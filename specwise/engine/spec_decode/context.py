"""What a proposer may use of the engine it drafts for, and nothing more.

The target's runner gives a drafter the paged KV cache layout (block size, number of
blocks) and, for self-speculation, the target itself; a drafter with a model of its
own builds a runner of the same shape so the scheduler's block tables address both.
A drafter that reads the target's features (EAGLE, Medusa) registers an observer
(`observe_features`); the engine drops every observer when it switches drafters.
"""

from dataclasses import dataclass
from typing import Callable

import torch

from specwise.engine.model_runner import ModelRunner
from specwise.engine.step_features import StepFeatures
from specwise.models.tokenizer import Tokenizer


@dataclass(frozen=True)
class ProposerContext:
    runner: ModelRunner          # the target's runner: its model, KV cache and block layout
    tokenizer: Tokenizer         # the target's tokenizer (a draft model must share its vocabulary)
    dtype: torch.dtype
    device: str
    max_model_len: int

    @property
    def vocab_size(self) -> int:
        return self.runner.model.config.vocab_size

    @property
    def num_layers(self) -> int:
        return self.runner.model.config.num_hidden_layers

    def observe_features(self, observer: Callable[[StepFeatures], None], layers: list[int] | None = None) -> None:
        """Have `observer` called with the target's features of every step (step_features.py); with
        `layers`, the residual streams after those many decoder layers too (StepFeatures.layers)."""
        self.runner.feature_observers.append(observer)
        if layers:
            self.runner.feature_layers = list(layers)
