"""Acceptance per simulated request: drawn from measured requests, not one rate for all.

Each simulated request gets its own per-position acceptance p_1 >= ... >= p_k and its own
share of decode steps that carry drafts. A verification step of that request draws one
uniform u and accepts the drafts at positions i with u < p_i (so position i is accepted
only if every earlier one was, with probability p_i overall), and one more uniform against
the drafting share (n-gram lookup finds no match at some steps and verifies 1 token). A drafting step's length is the request's measured mean share of k (n-gram
matches often run short of k), never fewer than the drafts it accepts.

Where the values come from, best first:
  - `own`: the measured record of the same request in the same arm (`simulate --validate`
    replays a run request for request);
  - the arm's measured requests (`from=RESULTS_DIR`): a request draws one measured request of
    its category (any category where its own has none), so the request-to-request spread
    of a real workload is kept;
  - the arm's aggregate acceptance (alpha, positions, rate): the same for every request.
"""

from dataclasses import dataclass

import numpy as np

from specwise.bench.results import RequestRecord
from specwise.calc.arms import SpecArm


@dataclass(frozen=True)
class Draws:
    rates: np.ndarray          # [k] probability that draft position i + 1 is accepted
    fraction: float            # share of the request's decode steps that carry drafts, in [0, 1]
    length: float = 1.0        # mean drafted tokens per draft / k: n-gram matches run short of k


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


def from_record(record: RequestRecord, k: int) -> Draws | None:
    if record.drafts is None or record.error:
        return None
    return from_counts(record.drafts, record.accepted_per_position, record.output_tokens,
                       record.accepted_tokens or 0, k, record.draft_tokens)


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
