"""Autoregressive drafting with a model: the shared loop of `draft` and `layer_skip`.

For a sequence of n tokens whose drafter K/V is valid for positions [0, c):
  1. catch up: feed tokens[c:n] at positions c..n-1, sample draft token 1 from the last logits;
  2. feed draft token j at position n+j-1 and sample draft token j+1, until k tokens.
The drafter writes K/V up to position n+k-2, inside the k lookahead slots the scheduler
reserved for the target, through the target's own block table. Draft tokens are sampled
from the distribution the verifier scores at their position (draft_sampler.py), so full
rejection sampling applies and acceptance stays high under penalties and grammars.
"""

import torch

from specwise.engine.model_runner import ModelRunner
from specwise.engine.spec_decode.draft_sampler import DraftSampler, stack_draft_probs
from specwise.engine.spec_decode.proposer import Proposal


class ModelDrafter:
    def __init__(self, runner: ModelRunner, num_layers: int | None = None, vocab_size: int | None = None):
        self.runner = runner
        self.num_layers = num_layers
        self.vocab_size = vocab_size          # the target's; draft logits are padded or cut to it
        self.sampler = DraftSampler(runner)   # the draft runner shares the target's logits processing

    def free(self, seq) -> None:
        self.sampler.free(seq)

    def draft(self, seqs, num_draft_tokens: list[int], computed: list[int]) -> Proposal:
        active = [row for row, k in enumerate(num_draft_tokens) if k > 0]
        draft_ids = [[] for _ in seqs]
        draft_probs = [[] for _ in seqs]
        inputs = {row: self._known_ids(seqs[row].token_ids[computed[row]:]) for row in active}
        starts = {row: computed[row] for row in active}
        while active:
            logits = self._next_logits(seqs, active, inputs, starts)                 # [len(active), vocab]
            probs, tokens = self.sampler.sample(logits, [seqs[row] for row in active],
                                                [draft_ids[row] for row in active])
            for row, row_probs, token in zip(active, probs, tokens):
                draft_ids[row].append(token)
                draft_probs[row].append(row_probs)
                starts[row] += len(inputs[row])
                inputs[row] = [token]
            active = [row for row in active if len(draft_ids[row]) < num_draft_tokens[row]]
        stacked = stack_draft_probs(draft_probs)   # [k_i, vocab] or None (one-hot) each
        return Proposal(draft_ids, stacked)

    def _next_logits(self, seqs, rows, inputs, starts) -> torch.Tensor:
        # one flat forward: a long catch-up (a prompt) costs its own tokens only, nothing is padded
        logits = self.runner.forward([inputs[row] for row in rows], [starts[row] for row in rows],
                                     [seqs[row].block_table for row in rows], num_logits=[1] * len(rows),
                                     num_layers=self.num_layers)                # [len(rows), draft_vocab]
        return self._fit_vocab(logits)                                           # [len(rows), vocab]

    def _known_ids(self, token_ids: list[int]) -> list[int]:
        """A padded target may emit ids past the drafter's embeddings: feed 0 instead (only
        the drafts get worse; the verifier keeps the output exact)."""
        limit = self.runner.model.config.vocab_size
        return [token_id if token_id < limit else 0 for token_id in token_ids]

    def _fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        if self.vocab_size is None or logits.shape[-1] == self.vocab_size:
            return logits
        if logits.shape[-1] > self.vocab_size:
            return logits[..., :self.vocab_size]
        padding = logits.new_full((*logits.shape[:-1], self.vocab_size - logits.shape[-1]), float("-inf"))
        return torch.cat([logits, padding], dim=-1)
