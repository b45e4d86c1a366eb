"""The target's features of one step, handed to drafters that read them (EAGLE, Medusa).

A feature is the target's final-normed hidden state at a position: f_t, computed from
tokens 0..t, is what the LM head reads to give token t+1. The runner computes one for
every row of a step (prompt chunks included) and, when an observer is registered
(`ModelRunner.feature_observers`, through `ProposerContext.observe_features`), hands
them over before verifying; with no observer nothing is kept.

Which rows are real: sequence i fed num_tokens[i] tokens at positions start_positions[i]...
(a prompt chunk, or its last token plus its drafts). After the step the engine sets the
sequence's num_computed_tokens; features at positions at or past it belong to rejected
drafts, computed from tokens the sequence does not hold, and must be dropped.

Worked example: x_0..x_4 decoding with drafts d_1 d_2 d_3 (k = 3) feeds x_4 d_1 d_2 d_3 at
positions 4..7 and gets f_4..f_7. One draft accepted: the sequence becomes x_0..x_6
(x_5 = d_1, x_6 the recovered token), num_computed_tokens = 6, so f_4 and f_5 are real and
f_6, f_7 (computed over the rejected d_2, d_3) are not.
"""

import itertools
from dataclasses import dataclass

import torch

from specwise.engine.sequence import Sequence


@dataclass
class StepFeatures:
    seqs: list[Sequence]
    start_positions: list[int]      # position of each sequence's first fed token
    num_tokens: list[int]           # tokens fed per sequence (drafts included)
    hidden: torch.Tensor            # [sum(num_tokens), hidden_size], rows in batch order
    # the residual streams of the observed layers (ProposerContext.observe_features(layers=...)), side by
    # side: [sum(num_tokens), len(layers) * hidden_size]; None when no observer asked for any
    layers: torch.Tensor | None = None

    def __iter__(self):
        """(seq, first position, features [n, hidden]) per sequence."""
        return self.rows(self.hidden)

    def rows(self, tensor: torch.Tensor):
        """(seq, first position, tensor's rows of that sequence) per sequence, for hidden or layers."""
        offsets = [0, *itertools.accumulate(self.num_tokens)]
        for seq, position, start, end in zip(self.seqs, self.start_positions, offsets, offsets[1:]):
            yield seq, position, tensor[start:end]
