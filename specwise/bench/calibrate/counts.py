"""The count probe: what a step of a token count the server has not run lately costs it.

An eager CPU server builds each matmul's kernel (a oneDNN primitive, its plan and packed weights
layout) for the shapes it meets and keeps the last few in a bounded cache. A step of a token count
it ran lately reuses them; a new count builds them again. Our server on the 2-core VM, 12 pairs of
single token-id prompts (2026-12-05): 87.8 ms against 73.2 at 64 tokens, 130.1 against 124.2 at 200,
227.6 against 209.4 at 400, new count first. Under load a step's token count moves with the batch
and with the prompt chunks in it, so many steps pay that; the calibration's waves, a fixed batch
decoding step after step, almost never do, and its prefill probes always do.

What it found (docs/calculators.md, 2026-12-06, 2-core VM, counts of 16-143 tokens): 2-5 ms a new
count on our eager server (a memory of 14 counts to more than 62), 3-4 ms or nothing on vLLM for CPU
0.32 (more than 62), and replays charging it no better than replays without. So the probe runs only
where asked (`calibrate --endpoint --count-probes 32`).

The probe, single requests one after another, each of one output token:

    fresh L_1 .. L_M;  then for j = 0 .. M-1:  again L_{M-j}, fresh N_j = L_{M-j} + 1

At the revisit of L_{M-j}, 2 j other counts have run since its first time (L_{M-j+1} .. L_M and
N_0 .. N_{j-1}): it is quick while 2 j is within the server's memory of counts, and pays the build
again from there on. Each revisit is held against the fresh count run right after it, one token
longer (so a server that drifts over the probe moves both alike; a first probe design that held
each revisit against its own fresh run, up to 2 M requests earlier, saw our server 5-30 ms slower
in the second half for no count's sake): d_j = TTFT of N_j - TTFT of the again L_{M-j}, less
the token's own cost (the slope of the fresh runs' TTFT in their length). Then

    memory       = 2 j at the j where d steps down (the split of d into a higher then a lower run,
                   MIN_RUN or more each, with the least absolute deviation about the runs' medians);
                   2 M where it does not step down within the probe ("at least")
    new_count_s  = median(d before the step) - median(d after it) (median(d) where there is no step)

and no cost at all (0) when that is within the noise: under NOISE_FACTOR standard errors, the noise
taken from d's spread about its runs' medians. Worked example, d = 12, 14, 11, 13, 1, -2, 0, 1 ms at
j = 0..7: the step after j = 3, memory 8 counts, cost 12.5 - 0.5 = 12 ms.

A prompt of a given token count is sent as token ids (a completion prompt may be a list of them):
random ids, so that no two prompts share a prefix a prefix cache could reuse; ids in ID_RANGE, past
the special tokens at the bottom of common vocabularies and within every vocabulary's size. The
counts L are even counts drawn from COUNT_RANGE (short prompts: a TTFT's jitter grows with it),
apart from those the sweep's prefill probes ran, so that no N is an L.

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
from specwise.engine.cost.linear_cost import RecentCounts

COUNT_TAG = "counts"
COUNT_RANGE = (16, 144)        # prompt token counts the probe draws its L from (even ones)
ID_RANGE = (100, 10_000)
NOISE_FACTOR = 4.0
MIN_RUN = 3                    # revisits on each side of a step
MAX_COUNT_PROBES = 40          # of COUNT_RANGE's 64 even counts, some taken by the prefill probes
MEDIAN_SE = float(np.sqrt(np.pi / 2))


@dataclass(frozen=True)
class CountCost:
    new_count_s: float          # seconds a step pays for a token count not among the last `memory` run
    memory: int                 # distinct token counts the server keeps kernels for (at least, where not bounded)
    bounded: bool               # the memory was seen to end within the probe
    probed: int                 # M: counts the probe revisited
    noise_s: float              # the standard error the cost was held against

    def summary(self) -> str:
        if not self.new_count_s:
            return (f"a step of a new token count costs no more than one run lately (within {self.noise_s * 1e3:.1f} "
                    f"ms of noise, {self.probed} counts revisited)")
        noise = f"noise {self.noise_s * 1e3:.1f} ms, {self.probed} counts revisited"
        if self.bounded:
            return (f"a step of a token count not among the last {self.memory} run costs "
                    f"{self.new_count_s * 1e3:.1f} ms more ({noise})")
        return (f"a step of a token count not run before costs {self.new_count_s * 1e3:.1f} ms more (the server keeps "
                f"at least {self.memory} counts: it forgot none of the probe's; {noise})")


def probe_counts(count_probes: int, seed: int, avoid: set[int]) -> list[int]:
    """The probe's token counts in send order: L_1 .. L_M, then again L_{M-j} and N_j = L_{M-j} + 1 in turn."""
    evens = [n for n in range(COUNT_RANGE[0], COUNT_RANGE[1], 2) if n not in avoid and n + 1 not in avoid]
    counts = random.Random(seed).sample(evens, count_probes)
    return counts + [n for count in counts[::-1] for n in (count, count + 1)]


def count_requests(count_probes: int, seed: int, avoid: set[int]) -> list[WorkloadRequest]:
    """The probe's 3 M requests in send order, one output token each, prompts of random token ids."""
    rng = random.Random(seed)
    return [WorkloadRequest(request_id=f"{COUNT_TAG}-{i}", category="counts", max_tokens=1, prompt_tokens=n,
                            extra={"prompt_token_ids": [rng.randrange(*ID_RANGE) for _ in range(n)]})
            for i, n in enumerate(probe_counts(count_probes, seed, avoid))]


def count_cost(records: list[RequestRecord]) -> CountCost | None:
    """The probe's records in send order -> what a new count costs; None when it did not finish (the
    sweep's budget) or too few revisits came back."""
    if len(records) % 3:
        return None
    m = len(records) // 3
    ok = [not r.error and r.ttft is not None for r in records[:3 * m]]
    fresh = [(r.prompt_tokens, r.ttft) for r, good in zip(records[:m], ok) if good]
    if len(fresh) < 2 or len({n for n, _ in fresh}) < 2:
        return None
    slope = np.polyfit(*zip(*fresh), 1)[0]                  # seconds a prompt token, over the fresh runs
    # d_j: the fresh count run right after the revisit, less its extra token, less the revisit
    d = np.array([records[m + 2 * j + 1].ttft - slope - records[m + 2 * j].ttft for j in range(m)
                  if ok[m + 2 * j] and ok[m + 2 * j + 1]])
    if len(d) < 2 * MIN_RUN:
        return None
    split = _step(d)
    if split is not None:
        before, after = d[:split], d[split:]
        step, noise = float(np.median(before) - np.median(after)), _noise(before, after)
        if step > NOISE_FACTOR * noise:
            return CountCost(step, 2 * split, True, len(d), noise)
    # no step within the probe: every revisit was quick (a cost, the memory at least the probe's) or none was
    level, noise = float(np.median(d)), _noise(d)
    return CountCost(level if level > NOISE_FACTOR * noise else 0.0, 2 * len(d), False, len(d), noise)


def _step(d: np.ndarray) -> int | None:
    """Where d steps down: the split into a higher run then a lower one, MIN_RUN or more each, that leaves
    the least absolute deviation about the runs' medians (one wild revisit moves no median); None where
    no split steps down."""
    best, where = np.inf, None
    for split in range(MIN_RUN, len(d) - MIN_RUN + 1):
        before, after = d[:split], d[split:]
        if np.median(before) <= np.median(after):
            continue
        deviation = float(np.sum(np.abs(before - np.median(before))) + np.sum(np.abs(after - np.median(after))))
        if deviation < best:
            best, where = deviation, split
    return where


def _noise(*runs: np.ndarray) -> float:
    """The standard error of the difference of the runs' medians (of one run's median, for one run), the
    spread taken robustly (1.4826 x the median absolute deviation) about each run's own median. A median
    of n normal draws has a standard error sqrt(pi / 2) = 1.2533 times the mean's, sigma / sqrt(n)."""
    deviations = np.concatenate([run - np.median(run) for run in runs])
    sigma = 1.4826 * float(np.median(np.abs(deviations)))
    return MEDIAN_SE * sigma * float(np.sqrt(sum(1 / len(run) for run in runs)))


def paid(probes: list[list[RequestRecord]], cost: CountCost, budget: int | None) -> list[list[float]]:
    """What the prefill probes' requests paid for token counts the server had not run lately, its memory of
    counts walked in the order they ran (each request its prompt's chunks): for each probe's requests, in
    send order, the seconds each paid. The sweep's waves pay nothing that their decode windows hold: a wave's
    first step of its batch's count is left out of its window (samples.py). Worked example, memory 4: a
    probe of two 16-token prompts pays for the first; then one of 16, 32 and 16 pays for 32 only."""
    recent = RecentCounts(cost.new_count_s, cost.memory)
    return [[sum(recent.cost(chunk) for chunk in prompt_chunks(float(r.prompt_tokens), budget)[0])
             if not r.error else 0.0 for r in records] for records in probes]
