"""Sequences of the corpus as padded tensors, and the objective protocol every kind implements."""

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from specwise.train.data import Corpus


@dataclass
class Batch:
    token_ids: torch.Tensor     # [B, L] long, 0 past each sequence's end
    features: torch.Tensor      # [B, L, hidden] fp32
    target_next: torch.Tensor   # [B, L] long: the target's greedy token after position t
    lengths: torch.Tensor       # [B]
    response_start: torch.Tensor  # [B]
    aux: torch.Tensor | None = None     # [B, L, 3 * hidden] fp32: eagle3's residual streams (data.py)

    def valid(self, count: int, offset: int = 0) -> torch.Tensor:
        """[B, count] bool: position offset + c exists in its sequence."""
        positions = torch.arange(count) + offset
        return positions.unsqueeze(0) < self.lengths.unsqueeze(1)

    def shifted(self, name: str, offset: int, count: int) -> torch.Tensor:
        """getattr(self, name)[:, offset : offset + count], zero-padded to `count` columns."""
        tensor = getattr(self, name)[:, offset:offset + count]
        missing = count - tensor.shape[1]
        if missing > 0:
            pad = tensor.new_zeros(tensor.shape[0], missing, *tensor.shape[2:])
            tensor = torch.cat([tensor, pad], dim=1)
        return tensor


def make_batch(corpus: Corpus, seqs: list[int], with_features: bool = True) -> Batch:
    lengths = torch.tensor([corpus.length(s) for s in seqs])
    longest = int(lengths.max())
    token_ids = torch.zeros(len(seqs), longest, dtype=torch.long)
    target_next = torch.zeros(len(seqs), longest, dtype=torch.long)
    hidden = corpus.features.shape[1]
    features = torch.zeros(len(seqs), longest if with_features else 0, hidden)
    with_aux = with_features and corpus.aux is not None
    aux = torch.zeros(len(seqs), longest, corpus.aux.shape[1]) if with_aux else None
    for row, seq in enumerate(seqs):
        rows, length = corpus.rows(seq), corpus.length(seq)
        token_ids[row, :length] = corpus.token_ids[rows].long()
        target_next[row, :length] = corpus.target_next[rows].long()
        if with_features:
            features[row, :length] = corpus.features[rows].float()
        if with_aux:
            aux[row, :length] = corpus.aux[rows].float()
    return Batch(token_ids, features, target_next, lengths, corpus.response_start[seqs], aux)


class Objective(Protocol):
    """What the loop trains: `module`'s parameters, through `loss`; measured through `chain_drafts`."""

    module: nn.Module
    needs_features: bool

    def loss(self, batch: Batch, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        """Mean loss over the batch's positions, and named parts of it for the progress bar."""

    def chain_drafts(self, batch: Batch, k: int, first_chain: int = 0) -> torch.Tensor:
        """[L - 1 - first_chain, k] for a batch of one sequence: row i holds the k tokens drafted in the
        chain t = first_chain + i, right after the target emitted token t + 1 (its features known up
        to position t)."""

    def export(self, out: Path, card: str, training: dict) -> None:
        """Write the trained drafter to `out` in the form `--speculative` reads."""
