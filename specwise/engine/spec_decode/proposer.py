"""The proposer protocol: what every drafting method gives the engine.

A proposer looks at the sequences of one step and returns, for each, up to the
requested number of draft tokens. Methods that draft by sampling a model
(draft model, layer skip, EAGLE, Medusa) also return the draft probabilities
the tokens were sampled from, after the request's temperature, top-k and top-p
were applied with `specwise.engine.sampling.sampler.logits_to_probs`. Methods that draft
deterministically (n-gram prompt lookup) return None: their drafts are one-hot,
p_draft(x) = 1 for the proposed token x.

Method specific code lives in the method's own file; the engine only sees this.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from specwise.engine.spec_decode.draft_tree import DraftTree

if TYPE_CHECKING:
    from specwise.engine.sequence import Sequence


@dataclass
class Proposal:
    """Draft tokens for one step: one (possibly empty) list per sequence, in batch order."""

    draft_token_ids: list[list[int]]
    # per sequence: [len(draft_token_ids[i]), vocab_size], or None for a one-hot draft;
    # None for the whole list when every draft is one-hot
    draft_probs: list[torch.Tensor | None] | None = None
    # per sequence: a trie of one-hot drafts and free rows fed in the same forward (draft_tree.py)
    # instead of a chain (its draft_token_ids entry is then empty); None for the whole list: chains only
    trees: list[DraftTree | None] | None = None

    def __post_init__(self):
        if self.trees is not None:
            if len(self.trees) != len(self.draft_token_ids):
                raise ValueError(f"trees has {len(self.trees)} entries for {len(self.draft_token_ids)} sequences")
            if any(tree is not None and token_ids for tree, token_ids in zip(self.trees, self.draft_token_ids)):
                raise ValueError("a sequence has both a draft tree and a chain of drafts")
        if self.draft_probs is None:
            return
        if len(self.draft_probs) != len(self.draft_token_ids):
            raise ValueError(f"draft_probs has {len(self.draft_probs)} entries for "
                             f"{len(self.draft_token_ids)} sequences")
        for row, (token_ids, probs) in enumerate(zip(self.draft_token_ids, self.draft_probs)):
            if probs is not None and (probs.dim() != 2 or probs.shape[0] != len(token_ids)):
                raise ValueError(f"draft_probs[{row}] has shape {tuple(probs.shape)}, "
                                 f"expected [{len(token_ids)}, vocab_size]")

    @property
    def num_draft_tokens(self) -> list[int]:
        return [len(token_ids) for token_ids in self.draft_token_ids]

    def tree(self, index: int) -> DraftTree | None:
        return None if self.trees is None else self.trees[index]

    def num_rows(self, index: int) -> int:
        """Query rows sequence `index` adds after its last token: its chain, or its tree's rows."""
        tree = self.tree(index)
        return len(self.draft_token_ids[index]) if tree is None else tree.num_rows

    def num_drafted(self, index: int) -> int:
        """Draft tokens counted for sequence `index` once verified: the chain's length, or the length
        of the tree's candidate that the accepted path followed (DraftTree.drafted)."""
        tree = self.tree(index)
        return len(self.draft_token_ids[index]) if tree is None else tree.drafted(tree.accepted or [])

    def padded_draft_probs(self, max_k: int, vocab_size: int,
                           device: torch.device | str = "cpu") -> torch.Tensor | None:
        """The verifier's `draft_probs` argument: [num_seqs, max_k, vocab_size], or None if all one-hot.

        Rows past a sequence's own draft length are zero; a sequence without
        probabilities in a mixed batch gets one-hot rows at its draft tokens.
        """
        if self.draft_probs is None or all(probs is None for probs in self.draft_probs):
            return None
        padded = torch.zeros(len(self.draft_token_ids), max_k, vocab_size,
                             dtype=torch.float32, device=device)  # [num_seqs, max_k, vocab_size]
        for row, (token_ids, probs) in enumerate(zip(self.draft_token_ids, self.draft_probs)):
            if len(token_ids) > max_k:
                raise ValueError(f"sequence {row} has {len(token_ids)} draft tokens, more than max_k={max_k}")
            if probs is not None:
                padded[row, :len(token_ids)] = probs.to(device=device, dtype=torch.float32)
            elif token_ids:
                positions = torch.arange(len(token_ids), device=device)
                padded[row, positions, torch.tensor(token_ids, device=device)] = 1.0
        return padded


class Proposer(Protocol):
    """A drafting method. `propose` may return fewer tokens than asked (none at all is fine).

    A proposer that returns draft trees may set `budget_counts_rows = True`: num_draft_tokens[i] then
    counts the rows its tree may feed (bounded only by max_model_len, not by the tokens the request may
    still emit), and the proposer keeps the tree's depth within those itself (`draft_tree.tokens_left`).
    Such a proposer may also define `auto_levels(max_k) -> [(k, positions verified)]`, the budgets the
    auto k policy chooses among (policy.py). A proposer that keeps tokens across requests (suffix's global
    cache) says how many in `cached_tokens` (the server's /metrics shows it; absent: none).
    """

    def propose(self, seqs: "list[Sequence]", num_draft_tokens: list[int]) -> Proposal:
        """Draft up to num_draft_tokens[i] tokens after seqs[i].token_ids."""
        ...

    def free(self, seq: "Sequence") -> None:
        """Forget any state kept for `seq` (finished, aborted or preempted)."""
        ...
