"""What a request's settings do to the target's logits before temperature, top-k and top-p.

A row is one position to sample: a sequence, plus the drafts ahead of that position taken as
accepted (`drafts_before`). Row (i, j) of a verification step has drafts_before = drafts[:j];
a drafter's row after it drafted d tokens has drafts_before = d. Every setting below reads the
sequence's tokens *plus* drafts_before, so draft position j is processed exactly as plain
decoding would process that position once drafts 0..j-1 were emitted: the verifier and the
drafter see the same processed distribution, and speculation stays lossless.

In order (vLLM's semantics for each):
  1. min_tokens: while output + drafts_before < min_tokens, end-of-sequence and stop_token_ids
     get -inf.
  2. logit_bias: logit[t] += bias[t].
  3. repetition_penalty p (HF / vLLM, over prompt + output tokens): a seen token's logit l
     becomes l / p if l > 0, else l * p.
  4. frequency_penalty f, presence_penalty r (OpenAI, over output tokens):
     logit[t] -= f * count(t) + r * (count(t) > 0).
  5. structured output: tokens the grammar forbids get -inf (`grammar.py`).

Worked example: output so far [7, 7], drafts [9], frequency_penalty 0.5. Row j=0 (after
[7, 7]): logit[7] -= 1.0. Row j=1 (after [7, 7, 9]): logit[7] -= 1.0, logit[9] -= 0.5.

Logprobs returned to clients are log_softmax of these processed logits, before temperature,
top-k and top-p (vLLM's `processed_logits` logprobs mode): defined for greedy requests too,
and the target's, never the drafter's.
"""

from dataclasses import dataclass

import torch

from specwise.engine.fault_isolation import RequestFault, describe
from specwise.engine.sampling.grammar import GrammarCompiler, GrammarMatcher
from specwise.engine.sequence import Sequence


@dataclass
class Row:
    seq: Sequence
    drafts_before: list[int]


class LogitsProcessing:
    """Shared by the target's runner and the drafters' (one per engine): the end-of-sequence ids
    for min_tokens, and each structured request's grammar matcher (by seq_id)."""

    def __init__(self, eos_token_ids: list[int], grammars: GrammarCompiler | None = None):
        self.eos_token_ids = list(eos_token_ids)
        self.compiler = grammars
        self.matchers: dict[int, GrammarMatcher] = {}

    def add(self, seq: Sequence) -> None:
        spec = seq.sampling_params.structured_output
        if spec is not None:
            self.matchers[seq.seq_id] = self.compiler.matcher(spec)

    def release(self, seq: Sequence) -> None:
        self.matchers.pop(seq.seq_id, None)

    def matcher(self, seq: Sequence) -> GrammarMatcher | None:
        return self.matchers.get(seq.seq_id)

    def accept(self, seq: Sequence, token_ids: list[int]) -> None:
        matcher = self.matchers.get(seq.seq_id)
        if matcher is not None:
            matcher.accept(token_ids)

    def apply(self, logits: torch.Tensor, rows: list[Row]) -> torch.Tensor:
        """logits [len(rows), vocab_size] -> processed logits, same shape fp32 (a copy where changed)."""
        touched = [index for index, row in enumerate(rows) if row.seq.sampling_params.processes_logits]
        if not touched:
            return logits
        logits = logits.float().clone()
        by_seq: dict[int, list[int]] = {}
        for index in touched:
            by_seq.setdefault(rows[index].seq.seq_id, []).append(index)
        for indices in by_seq.values():
            seq = rows[indices[0]].seq
            drafts = [rows[index].drafts_before for index in indices]
            try:
                logits[indices] = self._apply_seq(logits[indices], seq, drafts)
            except Exception as error:          # this request's settings or grammar: its fault alone
                raise RequestFault([seq], f"logits processing: {describe(error)}") from error
        return logits

    def _apply_seq(self, logits: torch.Tensor, seq: Sequence, drafts_before: list[list[int]]) -> torch.Tensor:
        """logits [rows, vocab] of one sequence, row r after drafts_before[r]."""
        params = seq.sampling_params
        num_rows, vocab_size = logits.shape
        device = logits.device
        if params.min_tokens:
            stops = [t for t in self.eos_token_ids + list(params.stop_token_ids) if t < vocab_size]
            for row, drafts in enumerate(drafts_before):
                if seq.num_output_tokens + len(drafts) < params.min_tokens and stops:
                    logits[row, stops] = float("-inf")
        if params.logit_bias:
            ids = torch.tensor(list(params.logit_bias), dtype=torch.long, device=device)
            logits[:, ids] += torch.tensor(list(params.logit_bias.values()), dtype=logits.dtype, device=device)
        if params.repetition_penalty != 1.0:
            seen = token_counts(seq.token_ids, drafts_before, vocab_size, device) > 0       # [rows, vocab]
            penalty = params.repetition_penalty
            penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
            logits = torch.where(seen, penalised, logits)
        if params.frequency_penalty or params.presence_penalty:
            counts = token_counts(seq.output_token_ids, drafts_before, vocab_size, device)  # [rows, vocab]
            logits = logits - params.frequency_penalty * counts - params.presence_penalty * (counts > 0)
        matcher = self.matchers.get(seq.seq_id)
        if matcher is not None:
            allowed = matcher.masks(drafts_before).to(device)                               # [rows, vocab]
            logits = logits.masked_fill(~allowed, float("-inf"))
        return logits


def token_counts(token_ids: list[int], drafts_before: list[list[int]], vocab_size: int,
                 device) -> torch.Tensor:
    """[len(drafts_before), vocab_size] fp32: occurrences of each token in token_ids + drafts_before[r]."""
    base = torch.bincount(torch.tensor(token_ids, dtype=torch.long), minlength=vocab_size)[:vocab_size]
    counts = base.float().repeat(len(drafts_before), 1)
    for row, drafts in enumerate(drafts_before):
        if drafts:
            counts[row] += torch.bincount(torch.tensor(drafts, dtype=torch.long), minlength=vocab_size)[:vocab_size]
    return counts.to(device)
