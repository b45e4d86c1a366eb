"""Fault isolation: a fault in one request's work fails that request, not every request of its step.

A step first computes (drafts, the target's forward, logits processing, verification) and only
then commits (appends tokens, advances grammar matchers, finishes requests). Computing changes
nothing a retry would see: K/V is written only to slots past each sequence's computed tokens
(rewritten by the retry), the sampled requests' random streams are restored
(`ModelRunner.restore_rng`), and a drafter's state can change its drafts, never the output.
So when computing raises, `isolate` retries without committing anything:

  - a `RequestFault` names the requests whose work raised (per-request code that knows: logits
    processing, a row of logits with no finite maximum): they fail, the rest are retried together;
  - any other exception cannot say whose work raised (a proposer, a grammar or the sampler called
    on the whole batch): the batch is split in halves and each half retried, until the requests
    whose work raises alone are found. A request fails when its work raises alone (its second
    failure at least: once in the batch, once alone); it is never retried after that.

Committing is per request, so a fault there (a grammar matcher refusing a token, the detokenizer)
is attributed directly by the engine (`LLMEngine._commit`).

A fault that every request of a step hits alone is not theirs but the engine's (the model raising
for every input): with two or more requests in the step, or after DEAD_AFTER_FAILED_STEPS steps in a
row in which every request failed, the engine raises `EngineDead`.

Worked example: 7 requests, request 5's drafts raise. [0..6] raises -> [0..2] computes, [3..6]
raises -> [3, 4] computes, [5, 6] raises -> [5] raises (fails), [6] computes: 6 requests advance,
at the price of 6 more computations over parts of this step's batch.
"""

from typing import Callable, TypeVar

from specwise.engine.scheduler import ScheduledBatch
from specwise.engine.sequence import Sequence

T = TypeVar("T")

DEAD_AFTER_FAILED_STEPS = 3      # steps in a row whose every request failed: a single-request server's bound


class RequestFault(Exception):
    """Raised by per-request code that knows whose work failed."""

    def __init__(self, seqs: list[Sequence], reason: str):
        super().__init__(reason)
        self.seqs = seqs


class EngineDead(RuntimeError):
    """A fault no request can be blamed for: the engine cannot go on."""


def isolate(batch: ScheduledBatch, compute: Callable[[ScheduledBatch], list[T]]
            ) -> tuple[dict[int, T], dict[int, Exception]]:
    """compute(batch) -> one result per sequence, committing nothing. Returns {row: result} for the rows
    whose work computed and {row: exception} for those whose work raised alone (or was named)."""
    results: dict[int, T] = {}
    faults: dict[int, Exception] = {}
    pending = [list(range(len(batch.seqs)))]
    while pending:
        rows = pending.pop(0)
        try:
            results.update(zip(rows, compute(batch.subset(rows))))
        except RequestFault as fault:
            named = [row for row in rows if batch.seqs[row] in fault.seqs]
            if not named:
                pending.extend(split(rows, faults, fault))
                continue
            faults.update((row, fault) for row in named)
            rest = [row for row in rows if row not in named]
            if rest:
                pending.append(rest)
        except Exception as error:
            pending.extend(split(rows, faults, error))
    return results, faults


def split(rows: list[int], faults: dict[int, Exception], error: Exception) -> list[list[int]]:
    """The halves to retry, or none: a row that raised alone has failed."""
    if len(rows) == 1:
        faults[rows[0]] = error
        return []
    half = len(rows) // 2
    return [rows[:half], rows[half:]]


class FailedSteps:
    """Counts steps in a row in which every request failed; `check` raises EngineDead when the fault
    cannot be the requests'."""

    def __init__(self):
        self.in_a_row = 0

    def check(self, num_seqs: int, faults: dict[int, Exception]) -> None:
        if len(faults) < num_seqs:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        if num_seqs >= 2 or self.in_a_row >= DEAD_AFTER_FAILED_STEPS:
            error = next(iter(faults.values()))
            raise EngineDead(f"every request of the step failed ({num_seqs} in this step, {self.in_a_row} "
                             f"step(s) in a row): {describe(error)}") from error


def describe(error: BaseException) -> str:
    """One line naming the error: 'ValueError: bad row'."""
    return f"{type(error).__name__}: {error}"
