"""The count probe: what a step of a token count the server has not run lately costs it.

An eager CPU server builds each matmul's kernel (a oneDNN primitive, its plan and packed weights
layout) for the shapes it meets and keeps the last few in a bounded cache. A step of a token count
it ran lately reuses them; a new count builds them again. Our server on the 2-core VM, 12 pairs of
single token-id prompts (2026-12-05): 87.8 ms against 73.2 at 64 tokens, 130.1 against 124.2 at 200,
227.6 against 209.4 at 400, new count first. Under load a step's token count moves with the batch
and with the prompt chunks in it, so many steps pay that; the calibration's waves, a fixed batch
decoding step after step, almost never do, and its prefill probes always do.

The probe: M single requests of distinct token counts L_1..L_M, one after another, each count the
first time in this sweep ("fresh"), then the same counts again in reverse order, L_M first
("again"). At the revisit of L_{M-j}, j other counts have run since L_{M-j} first did: it is quick
while j is within the server's memory of counts, and pays the build again from there on. So with
d_j = TTFT fresh - TTFT again of the count revisited j-th:

    memory       = the j where d steps down (the split of d into a higher then a lower run that
                   leaves the least squared error), M when it does not step down within the probe
    new_count_s  = median(d before the step) - median(d after it) (0 after it when there is no step)

and no cost at all (0) when that is within the noise: under NOISE_FACTOR standard errors, the noise
taken from the d's spread about their runs' medians. Worked example, d = 12, 14, 11, 13, 1, -2, 0,
1 ms: memory 4 counts, cost 12.5 - 0.5 = 12 ms.

A prompt of a given token count is sent as token ids (a completion prompt may be a list of them):
random ids, so that no two prompts share a prefix a prefix cache could reuse; ids in ID_RANGE, past
the special tokens at the bottom of common vocabularies and within every vocabulary's size. The
counts are drawn from COUNT_RANGE, apart from those the sweep's prefill probes ran.

The prefill probes before it paid the cost wherever their prompt's token count was new (`paid`: a
probe's first request of a count always, its repeats where their counts differ, text cut by characters
giving a count or two apart); it comes off their TTFTs before the fit, which would otherwise take it
for part of the request overhead.
"""

import random
from dataclasses import dataclass

import numpy as np

from specwise.bench.calibrate.samples import prompt_chunks
from specwise.bench.inputs.request import WorkloadRequest
from specwise.bench.results import RequestRecord
from specwise.engine.step_fit import RecentCounts

COUNT_TAG = "counts"
COUNT_RANGE = (40, 240)        # prompt token counts the probe draws from: short prefills, little jitter
ID_RANGE = (100, 10_000)
NOISE_FACTOR = 4.0
MIN_RUN = 2                    # counts on each side of a step


@dataclass(frozen=True)
class CountCost:
    new_count_s: float          # seconds a step pays for a token count not among the last `memory` run
    memory: int                 # distinct token counts the server keeps kernels for (at least, where it is M)
    probed: int                 # M: counts the probe ran
    noise_s: float              # the standard error the cost was held against

    @property
    def bounded(self) -> bool:
        """The memory was seen to end within the probe (else it holds at least `probed` counts)."""
        return self.memory < self.probed

    def summary(self) -> str:
        if not self.new_count_s:
            return (f"a step of a new token count costs no more than one run lately (within {self.noise_s * 1e3:.1f} "
                    f"ms of noise, {self.probed} counts)")
        memory = f"{self.memory}" if self.bounded else f"at least {self.memory}"
        return (f"a step of a token count not among the last {memory} run costs {self.new_count_s * 1e3:.1f} ms more "
                f"(noise {self.noise_s * 1e3:.1f} ms, {self.probed} counts)")


def count_requests(count_probes: int, seed: int, avoid: set[int]) -> list[WorkloadRequest]:
    """The probe's 2 M requests in send order (fresh L_1..L_M, then again L_M..L_1), one output token each."""
    rng = random.Random(seed)
    counts = rng.sample([n for n in range(*COUNT_RANGE) if n not in avoid], count_probes)
    order = counts + counts[::-1]
    return [WorkloadRequest(request_id=f"{COUNT_TAG}-{i}", category="counts", max_tokens=1, prompt_tokens=n,
                            extra={"prompt_token_ids": [rng.randrange(*ID_RANGE) for _ in range(n)]})
            for i, n in enumerate(order)]


def count_cost(records: list[RequestRecord]) -> CountCost | None:
    """The probe's records in send order -> what a new count costs; None when too few pairs came back."""
    half = len(records) // 2
    fresh, again = records[:half], records[half:2 * half][::-1]       # again[i] revisits fresh[i]
    pairs = [(a.ttft - b.ttft) for a, b in zip(fresh, again)
             if not a.error and not b.error and a.ttft is not None and b.ttft is not None]
    # d_j: j other counts ran since the revisited count's first time (fresh[i] is revisited (M - 1 - i)-th)
    d = np.array(pairs[::-1])
    if len(d) < 2 * MIN_RUN:
        return None
    split = _step(d)
    if split is not None:
        before, after = d[:split], d[split:]
        step, noise = float(np.median(before) - np.median(after)), _noise(before, after)
        if step > NOISE_FACTOR * noise:
            return CountCost(step, split, len(d), noise)
    # no step within the probe: every revisit was quick (a cost, memory at least M) or none was (no cost)
    level, noise = float(np.median(d)), _noise(d)
    return CountCost(level if level > NOISE_FACTOR * noise else 0.0, len(d), len(d), noise)


def _step(d: np.ndarray) -> int | None:
    """Where d steps down: the split into a higher run then a lower one, MIN_RUN or more each, that
    leaves the least squared error about the runs' medians; None where no split steps down."""
    best, where = np.inf, None
    for split in range(MIN_RUN, len(d) - MIN_RUN + 1):
        before, after = d[:split], d[split:]
        if np.median(before) <= np.median(after):
            continue
        error = float(np.sum((before - np.median(before)) ** 2) + np.sum((after - np.median(after)) ** 2))
        if error < best:
            best, where = error, split
    return where


def _noise(*runs: np.ndarray) -> float:
    """The standard error of the difference of the runs' medians (of one run's median, for one run), the
    spread taken robustly (1.4826 x the median absolute deviation) about each run's own median."""
    deviations = np.concatenate([run - np.median(run) for run in runs])
    sigma = 1.4826 * float(np.median(np.abs(deviations)))
    return sigma * float(np.sqrt(sum(1 / len(run) for run in runs)))


def paid(probes: list[list[RequestRecord]], cost: CountCost, budget: int | None) -> list[list[float]]:
    """For the prefill probes' requests, in send order: the seconds each paid for token counts the server
    had not run lately (its prompt's chunks' counts, through the server's memory of counts)."""
    recent = RecentCounts(cost.new_count_s, cost.memory)
    return [[sum(recent.cost(chunk) for chunk in prompt_chunks(float(r.prompt_tokens), budget)[0])
             if not r.error else 0.0 for r in records] for records in probes]
