"""Acceptance per simulated request: drawn from measured requests, not one rate for all.

Each simulated request gets its own per-position acceptance p_1 >= ... >= p_k and its own share
of decode steps that carry drafts. A verification step of that request draws one uniform u and
accepts the drafts at positions i with u < p_i (so position i is accepted only if every earlier
one was, with probability p_i overall), and one more uniform against the drafting share (n-gram
lookup finds no match at some steps and verifies 1 token). A drafting step's length is the
request's measured mean share of k (n-gram matches often run short of k), never fewer than the
drafts it accepts.

Where the values come from, best first:
  - `own`: the measured record of the same request in the same arm (`simulate --validate`
    replays a run request for request). Its drafts are replayed as counted, not drawn
    (`Replay`): the same number of drafts, each accepting one of the measured lengths, spread
    evenly over its decode steps, so the request runs its measured number of steps;
  - the arm's measured requests (`from=RESULTS_DIR`): a request draws one measured request of
    its category (any category where its own has none), so the request-to-request spread
    of a real workload is kept;
  - the arm's aggregate acceptance (alpha, positions, rate): the same for every request.
"""

import dataclasses
import heapq
import math
from dataclasses import dataclass

import numpy as np

from specwise.bench.results import RequestRecord
from specwise.calc.arms import SpecArm


# the golden ratio's fraction: the n-th of a request's replayed drafts is the one at rank frac(n x PHI)
PHI = (5 ** 0.5 - 1) / 2


@dataclass(frozen=True)
class Replay:
    """A measured request's drafts, replayed as counted. Its per-position counters tell how many
    drafts accepted exactly j tokens (those accepting at least j less those accepting at least
    j + 1); the replay verifies that many drafts of each length, in an order spread by PHI (not
    all the long ones first). The i-th of its D drafts comes at decode step 1 + floor((i + 1/2)
    (S - 1) / D) of its S: spread evenly over all but the last, where a request has no room left
    to draft (at every step, where it drafted at every one). Each draft is at least as long as
    what it accepted, the measured draft tokens shared out over the shortest (`_water_fill`; the
    total exact). Worked example: 6 decode steps, per-position [2, 1, 0, 0] over 3 drafts of 9
    tokens: accepted lengths 0, 2 and 1 (in PHI's order) at steps 1, 3 and 5, each 3 tokens long."""
    steps: int                                   # the request's measured decode steps: output - 1 - accepted
    drafts: dict[int, tuple[int, int]]           # decode step (1-based) -> (accepted, drafted) there

    @classmethod
    def of(cls, drafts: int, per_position, output_tokens: int, accepted: int, draft_tokens: int | None,
           k: int) -> "Replay":
        at_least = [drafts, *[int(c) for c in (per_position or [])][:k], 0]
        lengths = [j for j in range(len(at_least) - 1) for _ in range(max(at_least[j] - at_least[j + 1], 0))]
        lengths = [lengths[i] for i in np.argsort((np.arange(len(lengths)) * PHI) % 1.0, kind="stable")]
        count, steps = len(lengths), max(output_tokens - 1 - accepted, 1)
        drafted = _water_fill(lengths, int(draft_tokens) if draft_tokens else k * count, k)
        # the i-th draft's step: spread over all but the last, or every step where it drafted at each
        at = [1 + math.floor((i + 0.5) * (steps - 1) / count) if count < steps else i + 1 for i in range(count)]
        return cls(steps, {at[i]: (lengths[i], drafted[i]) for i in range(count)})

    def draft(self, step: int) -> tuple[int, int] | None:
        """(accepted, drafted) at the request's step-th decode step that had room to draft, or None."""
        return self.drafts.get(step)


def _water_fill(accepted: list[int], total: int, k: int) -> list[int]:
    """Each draft's length: at least what it accepted, at most k, the shortest lengthened one token at a
    time until the lengths sum to total (or every draft is k long). Worked example: accepted [4, 0, 1],
    7 tokens, k = 4: [4, 2, 1] (a tie goes to the earlier draft)."""
    drafted = list(accepted)
    shortest = [(length, i) for i, length in enumerate(drafted) if length < k]
    heapq.heapify(shortest)
    for _ in range(max(total - sum(drafted), 0)):
        if not shortest:
            break
        length, i = heapq.heappop(shortest)
        drafted[i] = length + 1
        if length + 1 < k:
            heapq.heappush(shortest, (length + 1, i))
    return drafted


@dataclass(frozen=True)
class Draws:
    rates: np.ndarray          # [k] probability that draft position i + 1 is accepted
    fraction: float            # share of the request's decode steps that carry drafts, in [0, 1]
    length: float = 1.0        # mean drafted tokens per draft / k: n-gram matches run short of k
    replay: Replay | None = None    # a measured request's own drafts, replayed as counted (not drawn)


def from_counts(drafts: int, per_position, output_tokens: int, accepted: int, k: int,
                draft_tokens: int | None = None) -> Draws | None:
    """A request's measured counters -> its Draws (None where it never drafted and decoded nothing).

    decode steps = output tokens - 1 (the first comes from the prefill) - accepted drafts;
    fraction = drafts / decode steps. Worked example: 6 output tokens, 2 drafts of 4 with
    accepted_per_position [2, 1, 0, 0]: 3 accepted, decode steps 6 - 1 - 3 = 2, fraction 1,
    p = [1.0, 0.5, 0, 0]; 6 draft tokens: length 6 / 2 / 4 = 0.75 of k."""
    steps = output_tokens - 1 - accepted
    if drafts <= 0:
        return Draws(np.zeros(k), 0.0) if steps > 0 else None
    counts = np.zeros(k)
    given = np.asarray(per_position or [], dtype=float)[:k]
    counts[:len(given)] = given
    rates = np.minimum.accumulate(np.minimum(counts / drafts, 1.0))
    length = min(1.0, draft_tokens / drafts / k) if draft_tokens and k else 1.0
    return Draws(rates, min(1.0, drafts / steps) if steps > 0 else 1.0, length)


def from_record(record: RequestRecord, k: int, replay: bool = False) -> Draws | None:
    """A measured request's Draws; replay: its own drafts as counted (`Replay`), for the same request."""
    if record.drafts is None or record.error:
        return None
    draws = from_counts(record.drafts, record.accepted_per_position, record.output_tokens,
                        record.accepted_tokens or 0, k, record.draft_tokens)
    if draws is None or not replay or record.drafts <= 0:
        return draws
    return dataclasses.replace(draws, replay=Replay.of(record.drafts, record.accepted_per_position,
                                                       record.output_tokens, record.accepted_tokens or 0,
                                                       record.draft_tokens, k))


def assign(requests, arm: SpecArm, k: int, seed: int, own: dict[str, Draws] | None = None) -> list[Draws]:
    """One Draws per request (k = the most drafts the arm verifies in a step)."""
    rng = np.random.default_rng([seed, 7])
    spread = {category: [from_record(record, k) for record in records]
              for category, records in arm.measured_requests.items()}
    spread = {category: [d for d in draws if d is not None] for category, draws in spread.items()}
    pooled = [d for draws in spread.values() for d in draws]
    out = []
    for request in requests:
        if own and request.request_id in own:
            out.append(own[request.request_id])
            continue
        pool = spread.get(request.category) or pooled
        if pool:
            out.append(pool[int(rng.integers(len(pool)))])
            continue
        if not k:
            out.append(Draws(np.zeros(0), 0.0))
            continue
        acceptance = arm.acceptance_for(request.category)
        out.append(Draws(acceptance.rates(k), acceptance.draft_fraction))
    return out
