"""Replay a logged completion step by step, as the engine would have drafted and verified it.

Under greedy decoding the logged completion is what the target emits, whatever the drafter:
verification accepts draft tokens while they equal the target's own next tokens, then emits
the target's token. So a drafter's acceptance on logged traffic follows from the log alone:

    tokens = prompt + completion;  i = 1      (the first output token comes from prefill: no draft)
    while i < len(completion):
        k_i    = min(k, max_tokens - i - 1)     (the engine never drafts past the request's limit;
                                                 max_tokens = len(completion) when not logged)
        draft  = drafter.draft(tokens, len(prompt) + i, k_i)
        a      = how many leading draft tokens equal completion[i], completion[i + 1], ...
        record(len(draft), a) when the draft is not empty;  i += a + 1

For n-gram lookup `draft` is NgramProposer.lookup over the context, exactly what the engine
proposes, so the counts are the ones our engine measures with the same k and prompts (a
test checks this token for token). For a model drafter, `draft` is teacher-forced: one
forward pass of the drafter over prompt + completion gives its greedy next token after
every prefix, pred[t]; the chain it would draft from context length L is pred[L - 1],
pred[L], ... as long as each token matched the completion, which is all acceptance needs
(after the first mismatch nothing more is accepted). See scoring.py.

What a log cannot show: when a completion stopped on EOS or a stop string inside a step,
the engine also counts drafts accepted past the stop, which the log does not have; the
replay counts matches up to the logged end only (a slight underestimate on the last step).
The context window (max_model_len) is not modelled.

Worked example, k = 3, n-gram sizes 1..1, prompt [5, 8, 9], completion [5, 8, 9, 7]:
    i = 1: context [5, 8, 9, 5] -> lookup proposes [8, 9, 5] (k_i = min(3, 4 - 1 - 1) = 2: [8, 9]);
           completion[1:3] = [8, 9] -> 2 accepted, i = 3;
    i = 3: k_i = min(3, 4 - 3 - 1) = 0: no draft (the last token), i = 4: done.
    drafts 1, draft tokens 2, accepted 2: acceptance rate 1.0, mean acceptance length 3.0.
"""

from typing import Protocol

from specwise.engine.spec_decode.metrics import SpecStats
from specwise.engine.spec_decode.ngram import NgramProposer


class Drafter(Protocol):
    def prepare(self, token_ids: list[int]) -> None:
        """Called once per logged request with prompt + completion (model drafters score it here)."""

    def draft(self, token_ids: list[int], context_len: int, k: int) -> list[int]:
        """Up to k draft tokens following token_ids[:context_len]."""


class NgramDrafter:
    def __init__(self, min_n: int, max_n: int):
        self.proposer = NgramProposer(min_n, max_n)

    def prepare(self, token_ids: list[int]) -> None:
        pass

    def draft(self, token_ids: list[int], context_len: int, k: int) -> list[int]:
        return self.proposer.lookup(token_ids[:context_len], k)


def replay(drafter: Drafter, prompt_ids: list[int], completion_ids: list[int], k: int,
           max_tokens: int | None = None) -> SpecStats:
    """The speculative counters the engine would record generating this completion greedily."""
    stats = SpecStats()
    tokens = list(prompt_ids) + list(completion_ids)
    drafter.prepare(tokens)
    prompt_len, length = len(prompt_ids), len(completion_ids)
    limit = max(max_tokens or length, length)
    i = 1
    while i < length:
        k_step = max(0, min(k, limit - i - 1))
        draft = drafter.draft(tokens, prompt_len + i, k_step) if k_step else []
        accepted = 0
        for offset, token in enumerate(draft):
            if i + offset >= length or token != completion_ids[i + offset]:
                break
            accepted += 1
        stats.record(len(draft), accepted)
        i += accepted + 1
    return stats
