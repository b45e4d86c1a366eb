"""Sampling draft tokens from a drafter's logits, the way every sampling drafter does.

Draft j of a sequence comes from the distribution the verifier scores at position j: the
drafter's logits go through the target's logits processing (penalties, min_tokens,
logit_bias, grammar mask), counting the drafts made so far as accepted, then through the
request's temperature, top-k and top-p (`ModelRunner.probs`). So the draft probabilities are
exactly what full rejection sampling needs, and greedy rows are one-hot at the argmax.
Each request draws from a random stream of its own, seeded apart from the verifier's (the
same seed would correlate draft and acceptance draws). When every row is greedy the draft is
the argmax of the processed logits and its probabilities are one-hot there, which a Proposal
says with None: no softmax over the vocabulary (~0.5 ms a row for a 49k vocabulary).
"""

import torch

from specwise.engine.model_runner import ModelRunner
from specwise.engine.sampling.logits_processors import Row
from specwise.engine.sampling.sampler import request_generator, sample

DRAFT_SEED_OFFSET = 0x5DEECE66D


class DraftSampler:
    def __init__(self, runner: ModelRunner):
        self.runner = runner            # the target's: its logits processing and device
        self.generators: dict[int, torch.Generator] = {}

    def sample(self, logits: torch.Tensor, seqs, drafts_before: list[list[int]]) -> tuple[list, list[int]]:
        """logits [num_seqs, vocab] (one row per sequence, after its drafts_before) ->
        (per sequence its probs [vocab] fp32, or None when one-hot at the token; one token per sequence)."""
        greedy = [seq.sampling_params.greedy for seq in seqs]
        if all(greedy):
            processed = self.runner.processing.apply(logits, [Row(seq, list(drafts))
                                                              for seq, drafts in zip(seqs, drafts_before)])
            return [None] * len(seqs), processed.argmax(dim=-1).tolist()
        probs = self.runner.probs(logits.unsqueeze(1), seqs, drafts_before)[:, 0]          # [num_seqs, vocab]
        return list(probs), sample(probs, greedy, [self.generator(seq) for seq in seqs])

    def generator(self, seq) -> torch.Generator:
        if seq.seq_id not in self.generators:
            seed = (seq.seed + DRAFT_SEED_OFFSET) % 2**63
            self.generators[seq.seq_id] = request_generator(seed, self.runner.device)
        return self.generators[seq.seq_id]

    def free(self, seq) -> None:
        self.generators.pop(seq.seq_id, None)


def stack_draft_probs(per_seq: list[list]) -> list[torch.Tensor | None]:
    """Each sequence's draft probabilities as sampled, [k_i, vocab], or None when one-hot (greedy)."""
    return [None if not rows or any(row is None for row in rows) else torch.stack(rows) for rows in per_seq]
