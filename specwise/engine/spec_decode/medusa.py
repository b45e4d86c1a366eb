"""Medusa drafting: k residual heads on the feature that emitted the sequence's last token.

For a sequence of n tokens, x_{n-1} came from the target's feature f_{n-2} (the position
just below num_computed_tokens). Head i maps f_{n-2} to a feature for token n+i
(models/heads/medusa.py), so heads 0..k-1 draft the chain d_1..d_k in one pass: one small matmul
per head and one LM head call for all, no attention and no K/V. Draft d_{i+1} is sampled
from the request's processed distribution of lm_head(head_i(f_{n-2})), counting d_1..d_i as
accepted (draft_sampler.py), so rejection sampling is exact though the heads never see the
drafts before theirs.

Worked example: x_0..x_4 where x_4 was emitted from f_3; k = 3 drafts tokens 5, 6, 7 from
heads 0, 1, 2 on f_3. Of the features the runner hands over, only the last run of each
sequence is kept (f_{n-2} lies in it whatever was accepted).
"""

import torch

from specwise.config import MAX_SPECULATIVE_TOKENS
from specwise.engine.spec_decode.context import ProposerContext
from specwise.engine.spec_decode.draft_sampler import DraftSampler, stack_draft_probs
from specwise.engine.spec_decode.heads import DraftLMHead, load_head
from specwise.engine.spec_decode.proposer import Proposal
from specwise.engine.step_features import StepFeatures
from specwise.errors import ConfigError


class MedusaProposer:
    def __init__(self, context: ProposerContext, directory: str | None, num_speculative_tokens: int):
        self.model = context.runner.model              # its LM head drafts (heads.py)
        # directory None: the built-in heads for this target
        self.directory, drafter, self.heads = load_head("medusa", directory, context)
        self.lm_head = DraftLMHead(self.model, drafter.draft_vocab, context)
        if num_speculative_tokens > self.heads.num_heads:
            raise ConfigError(f"{self.directory}: these medusa heads draft at most {self.heads.num_heads} tokens, "
                              f"so k (--num-speculative-tokens) must be <= {self.heads.num_heads}, got "
                              f"{num_speculative_tokens}")
        self.sampler = DraftSampler(context.runner)
        # seq_id -> (first position, features [r, hidden]) of the sequence's last run (its tail)
        self.last_run: dict[int, tuple[int, torch.Tensor]] = {}
        context.observe_features(self.observe)

    def observe(self, step: StepFeatures) -> None:
        for seq, position, features in step:
            if seq.sampling_params.speculative:
                # a verification run is at most 1 + k rows; of a prompt chunk only its end can matter
                tail = features[-(1 + MAX_SPECULATIVE_TOKENS):]
                self.last_run[seq.seq_id] = (position + len(features) - len(tail), tail.clone())

    @torch.inference_mode()
    def propose(self, seqs, num_draft_tokens: list[int]) -> Proposal:
        rows = [row for row, k in enumerate(num_draft_tokens) if k > 0]
        draft_ids = [[] for _ in seqs]
        draft_probs = [[] for _ in seqs]
        if not rows:
            return Proposal(draft_ids)
        features = torch.stack([self._emitting_feature(seqs[row]) for row in rows])    # [len(rows), hidden]
        width = max(num_draft_tokens[row] for row in rows)
        predicted = self.heads(features)[:, :width]                                     # [len(rows), width, hidden]
        logits = self.lm_head(predicted.reshape(-1, predicted.shape[-1]))
        logits = logits.view(len(rows), width, -1)                                      # [len(rows), width, vocab]
        for position in range(width):
            active = [index for index, row in enumerate(rows) if num_draft_tokens[row] > position]
            drafting = [rows[index] for index in active]
            probs, tokens = self.sampler.sample(logits[active, position], [seqs[row] for row in drafting],
                                                [draft_ids[row] for row in drafting])
            for row, row_probs, token in zip(drafting, probs, tokens):
                draft_ids[row].append(token)
                draft_probs[row].append(row_probs)
        stacked = stack_draft_probs(draft_probs)   # [k_i, vocab] or None (one-hot) each
        return Proposal(draft_ids, stacked)

    def _emitting_feature(self, seq) -> torch.Tensor:
        """f_{n-2}: the target's feature at the position before the last token, [hidden]."""
        wanted = seq.num_computed_tokens - 1
        first, features = self.last_run.get(seq.seq_id, (0, None))
        if features is None or not first <= wanted < first + len(features):
            raise RuntimeError(f"Medusa drafter: the target's feature at position {wanted} was not observed")
        return features[wanted - first]

    def free(self, seq) -> None:
        self.last_run.pop(seq.seq_id, None)
        self.sampler.free(seq)
