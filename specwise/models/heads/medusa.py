"""Medusa heads: k residual blocks on the target's last feature, each predicting one token further.

Feature f_t (the target's final-normed hidden state at position t, see eagle.py) gives token
t+1 through the LM head. Head i maps it to a feature for token t+2+i:

    head_i(f) = f + SiLU(W_i f + b_i)          logits_i = lm_head(head_i(f))

Worked example: the target just emitted x_4 from f_3. Heads 0, 1, 2 on f_3 draft tokens 5, 6, 7,
each without seeing the drafts before it (cheap: one small matmul per head, no attention).
W_i starts at zero, so an untrained head predicts what the LM head already predicts.
The LM head is the target's: not stored, not trained.
"""

import torch
import torch.nn.functional as F
from torch import nn


class ResidualBlock(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size, bias=True)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int):
        super().__init__()
        self.heads = nn.ModuleList(ResidualBlock(hidden_size) for _ in range(num_heads))

    @property
    def num_heads(self) -> int:
        return len(self.heads)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features [num_rows, hidden] -> one feature per head [num_rows, num_heads, hidden]."""
        return torch.stack([head(features) for head in self.heads], dim=1)
