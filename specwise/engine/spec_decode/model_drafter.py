"""Autoregressive drafting with a model: the shared loop of `draft` and `layer_skip`.

For a sequence of n tokens whose drafter K/V is valid for positions [0, c):
  1. catch up: feed tokens[c:n] at positions c..n-1, sample draft token 1 from the last logits;
  2. feed draft token j at position n+j-1 and sample draft token j+1, until k tokens.
The drafter writes K/V up to position n+k-2, inside the k lookahead slots the scheduler
reserved for the target, through the target's own block table. Draft tokens are sampled
from `logits_to_probs` with the request's own settings, so full rejection sampling applies,
after the same logits processing the verifier applies (penalties, min_tokens, grammar mask),
counting the drafts made so far as accepted: draft j comes from the distribution the
verifier scores at position j, which keeps acceptance high under those settings.
"""

import torch

from specwise.engine.model_runner import ModelRunner
from specwise.engine.sampling.sampler import request_generator, sample
from specwise.engine.spec_decode.proposer import Proposal

# draft sampling must not reuse the verifier's random stream (same seed -> correlated draws)
DRAFT_SEED_OFFSET = 0x5DEECE66D


class ModelDrafter:
    def __init__(self, runner: ModelRunner, num_layers: int | None = None, vocab_size: int | None = None):
        self.runner = runner
        self.num_layers = num_layers
        self.vocab_size = vocab_size          # the target's; draft logits are padded or cut to it
        self.generators: dict[int, torch.Generator] = {}

    def free(self, seq) -> None:
        self.generators.pop(seq.seq_id, None)

    def generator(self, seq) -> torch.Generator:
        if seq.seq_id not in self.generators:
            seed = (seq.seed + DRAFT_SEED_OFFSET) % 2**63
            self.generators[seq.seq_id] = request_generator(seed, self.runner.device)
        return self.generators[seq.seq_id]

    def draft(self, seqs, num_draft_tokens: list[int], computed: list[int]) -> Proposal:
        active = [row for row, k in enumerate(num_draft_tokens) if k > 0]
        draft_ids = [[] for _ in seqs]
        draft_probs = [[] for _ in seqs]
        inputs = {row: self._known_ids(seqs[row].token_ids[computed[row]:]) for row in active}
        starts = {row: computed[row] for row in active}
        while active:
            probs = self._next_probs(seqs, active, inputs, starts, draft_ids)     # {row: [vocab]}
            tokens = self._sample(seqs, active, probs)
            for row in active:
                draft_ids[row].append(tokens[row])
                draft_probs[row].append(probs[row])
                starts[row] += len(inputs[row])
                inputs[row] = [tokens[row]]
            active = [row for row in active if len(draft_ids[row]) < num_draft_tokens[row]]
        stacked = [torch.stack(rows) if rows else None for rows in draft_probs]   # [k_i, vocab] each
        return Proposal(draft_ids, stacked)

    def _next_probs(self, seqs, rows, inputs, starts, draft_ids) -> dict[int, torch.Tensor]:
        # one flat forward: a long catch-up (a prompt) costs its own tokens only, nothing is padded
        logits = self.runner.forward([inputs[row] for row in rows], [starts[row] for row in rows],
                                     [seqs[row].block_table for row in rows], num_logits=[1] * len(rows),
                                     num_layers=self.num_layers)                # [len(rows), draft_vocab]
        logits = self._fit_vocab(logits).unsqueeze(1)                           # [len(rows), 1, vocab]
        probs = self.runner.probs(logits, [seqs[row] for row in rows],
                                  [draft_ids[row] for row in rows])[:, 0]              # [len(rows), vocab]
        return dict(zip(rows, probs))

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

    def _sample(self, seqs, rows, probs) -> dict[int, int]:
        stacked = torch.stack([probs[row] for row in rows])                          # [len(rows), vocab]
        greedy = [seqs[row].sampling_params.greedy for row in rows]
        generators = [self.generator(seqs[row]) for row in rows]
        return dict(zip(rows, sample(stacked, greedy, generators)))
