"""Held-out acceptance: chain drafting of k tokens simulated at every response position, each
draft checked by the engine's own verifier (`greedy_accept`).

For a held-out sequence, the chain at position t starts right after the target emitted token
t + 1 (t from the first response token's producer, response_start - 1, to the second-to-last
position). The target's tokens it is checked against are target_next[t+1 .. t+1+k]: the target's
greedy choices on the true prefix, which are its choices on the drafted prefix while the drafts
match (greedy_accept stops at the first mismatch). Near the end of a sequence k shrinks to what
is left, as the engine's does near max_tokens. The figures are SpecStats', the one definition:
mean acceptance length = 1 + accepted / drafts, per-position acceptance = accepted at i / drafts.
"""

from specwise.engine.sampling.rejection import greedy_accept
from specwise.engine.spec_decode.metrics import SpecStats
from specwise.train.batch import Objective, make_batch
from specwise.train.data import Corpus


def held_out_acceptance(objective: Objective, corpus: Corpus, seqs: list[int], k: int,
                        stride: int = 1) -> dict[str, SpecStats]:
    """SpecStats per category, plus "all"."""
    stats: dict[str, SpecStats] = {}
    module = objective.module
    was_training = module.training
    module.eval()
    for seq in seqs:
        batch = make_batch(corpus, [seq], objective.needs_features)
        length, start = int(batch.lengths[0]), int(batch.response_start[0])
        first = max(start - 1, 0)
        drafts = objective.chain_drafts(batch, k, first).tolist()             # [L - 1 - first, k]
        target_next = batch.target_next[0].tolist()
        category = corpus.categories[int(corpus.category[seq])]
        counts = stats.setdefault(category, SpecStats())
        for t in range(first, length - 1, stride):
            num_drafts = min(k, length - 2 - t)
            if num_drafts < 1:
                continue
            emitted = greedy_accept([target_next[t + 1:t + 2 + num_drafts]], [drafts[t - first][:num_drafts]])[0]
            counts.record(num_drafts, len(emitted) - 1)
    module.train(was_training)
    total = SpecStats()
    for counts in stats.values():
        total = total.merge(counts)
    return {**dict(sorted(stats.items())), "all": total}


def summary(stats: dict[str, SpecStats]) -> dict[str, dict]:
    """JSON-ready figures per category."""
    return {name: {"mean_acceptance_length": round(s.mean_acceptance_length or 1.0, 4),
                   "acceptance_rate": round(s.acceptance_rate or 0.0, 4),
                   "per_position": [round(p, 4) for p in s.per_position_acceptance], "drafts": s.drafts}
            for name, s in stats.items()}
