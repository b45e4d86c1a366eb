"""Sampling draft tokens from a drafter's logits, the way every sampling drafter does.

Draft j of a sequence comes from the distribution the verifier scores at position j: the
drafter's logits go through the target's logits processing (penalties, min_tokens,
logit_bias, grammar mask), counting the drafts made so far as accepted, then through the
request's temperature, top-k and top-p (`ModelRunner.probs`). So the draft probabilities are
exactly what full rejection sampling needs, and greedy rows are one-hot at the argmax.
Each request draws from a random stream of its own, seeded apart from the verifier's (the
same seed would correlate draft and acceptance draws).
"""

import torch

from specwise.engine.model_runner import ModelRunner
from specwise.engine.sampling.sampler import request_generator, sample

DRAFT_SEED_OFFSET = 0x5DEECE66D


class DraftSampler:
    def __init__(self, runner: ModelRunner):
        self.runner = runner            # the target's: its logits processing and device
        self.generators: dict[int, torch.Generator] = {}

    def sample(self, logits: torch.Tensor, seqs, drafts_before: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
        """logits [num_seqs, vocab] (one row per sequence, after its drafts_before) ->
        (probs [num_seqs, vocab] fp32, one token per sequence)."""
        probs = self.runner.probs(logits.unsqueeze(1), seqs, drafts_before)[:, 0]          # [num_seqs, vocab]
        greedy = [seq.sampling_params.greedy for seq in seqs]
        return probs, sample(probs, greedy, [self.generator(seq) for seq in seqs])

    def generator(self, seq) -> torch.Generator:
        if seq.seq_id not in self.generators:
            seed = (seq.seed + DRAFT_SEED_OFFSET) % 2**63
            self.generators[seq.seq_id] = request_generator(seed, self.runner.device)
        return self.generators[seq.seq_id]

    def free(self, seq) -> None:
        self.generators.pop(seq.seq_id, None)
