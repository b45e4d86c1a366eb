"""One wave of requests against a server -> the steps it ran, as StepSamples for the fit.

A wave is `batch_size` requests sent together, each a prompt of about the same length and a
forced output of the same length (ignore_eos, min_tokens = max_tokens). The server admits them,
prefills their prompts (in one step or in chunks mixed with the first decodes), then decodes all
of them together, one step after another, until the first one finishes. Between the moment the
last request got its first token (t0) and the moment the first request got its last (t1) every
step is a decode step of exactly `batch_size` sequences, so each request's chunks there arrive
one step apart:

    step seconds = (last chunk time - first chunk time) / steps between them   (per request)

pooled over the wave's requests (sums of spans over sums of steps). The spans start at the chunk of the
first step after t0, not at t0's: that step, the wave's first of `batch_size` decodes, is left out,
since its token count may be one the server had not run lately and paid to build kernels for
(counts.py), and it starts where the window's edge lies: which requests' spans took it in turned on
timestamps half a step apart (the client reads the wave's streams one after another), so that taking
its cost off the window's mean, as an earlier design did, took it off spans that never had it (one
timestamp 15 ms late in a recorded sweep moved the fitted cost per logits row by 20%). A chunk is one
step; without speculation, where a chunk carries its token count (continuous usage), a server that
merged two steps' tokens into one chunk is seen, and steps are counted as tokens. Chunk arrival times
carry transport jitter; only the two ends of each span do, so a window of N steps errs by jitter / N.

What a step computed, from each request's counters: rows = 1 + draft rows (drafted tokens per
decode step of that request: its draft_tokens / (output - 1 - accepted); 0 without speculation),
logits rows = rows, cached = its prompt + the tokens it had made at the middle of the window, less
the step's input token; the step's features are those of these sequences (engine/cost/linear_cost.py
StepShape: tokens, KV tokens read, attention pairs). Worked example: 4 requests of 100-token prompts,
no drafts, window from their 9th to their 29th chunk over 0.8 s: step 0.8 / 20 = 40 ms, 4 tokens,
4 x (100 + 19 - 1) = 472 KV tokens, 4 x 119 = 476 attention pairs.

Prefill steps are timed apart, by single requests sent one after another (`prefill_sample`): a
TTFT is the steps of the whole prompt with one logits row, plus the server's request overhead (the
HTTP round trip, tokenizing; fitted apart, engine/cost/step_fit.py). A prompt within the server's token
budget (max_num_batched_tokens) is one step of n rows over no cache, n (n + 1) / 2 attention pairs;
a longer one runs in chunks of the budget, each a step over the chunks before it: our server
(budget 512) prefills a 1,064-token prompt in three steps, and the TTFTs of a sweep taken as one
step each bent the straight line up at its longest probe (one recorded sweep: 42, 221 and 1,064
tokens measured 66, 140 and 784 ms, fitted 61, 164 and 650). A wave's own first step is no use for
that: its requests reach the server a few milliseconds apart, and an engine starts a step with
whichever have arrived; the steps that admit the rest are (admissions.py, `wave_admissions`).
"""

import dataclasses
from dataclasses import dataclass

import numpy as np

from specwise.bench.calibrate.admissions import admission_steps
from specwise.bench.results import RequestRecord
from specwise.engine.cost.kv_reads import KVReads
from specwise.engine.cost.linear_cost import StepShape
from specwise.engine.cost.step_fit import StepSample

EDGE = 0.5                  # a chunk half a step past t0, or within half a step of t1, is inside the window
MIN_WINDOW_STEPS = 3


@dataclass
class WaveSteps:
    """What one wave measured: its decode step (None when the window was too short)."""
    batch_size: int
    decode: StepSample | None
    window_steps: int = 0
    spread: float = 0.0          # relative spread of the per-request step estimates (noise)


def wave_steps(records: list[RequestRecord], batch_size: int, drafts: tuple[float, float] | None = None,
               reads: KVReads | None = None) -> WaveSteps:
    """records: the wave's requests (send_time on one clock). drafts: (draft tokens, accepted tokens)
    over the whole wave where requests carry no counters (a server's Prometheus deltas), else None.
    reads: how the server reads its KV cache (engine/cost/kv_reads.py); None: each sequence its own."""
    done = _finished(records)
    if len(done) < batch_size:
        return WaveSteps(batch_size, None)      # a lost request breaks the lockstep
    decode, window, spread = _decode(done, drafts, reads)
    return WaveSteps(batch_size, decode, window, spread)


def wave_admissions(records: list[RequestRecord], steps: WaveSteps, drafts: tuple[float, float] | None = None,
                    reads: KVReads | None = None, budget: int | None = None) -> list[StepSample]:
    """The wave's admission steps (admissions.py), where its decode window gave their scale; arguments as
    wave_steps's, budget: the server's token budget (max_num_batched_tokens; None: no limit)."""
    if steps.decode is None:                  # no window: a lost request, or too few steps to time
        return []
    done = _finished(records)
    return admission_steps(done, steps.decode.seconds, budget, [_per_step(r, drafts, len(done)) for r in done], reads)


def _finished(records: list[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if not r.error and r.ttft is not None and len(r.chunk_times) >= 2]


def _decode(done: list[RequestRecord], drafts, reads: KVReads | None) -> tuple[StepSample | None, int, float]:
    first = [r.send_time + r.chunk_times[0] for r in done]
    last = [r.send_time + r.chunk_times[-1] for r in done]
    t0, t1 = max(first), min(last)
    spans, steps, rows_fed, cached, estimates, trajectories, starts = 0.0, 0.0, [], [], [], [], []
    for r in done:
        times = np.asarray(r.chunk_times) + r.send_time
        emitted, rows = _per_step(r, drafts, len(done))
        # tokens made up to each chunk: counted by the server, else the first 1 and then a step's worth each
        made = np.cumsum(r.chunk_tokens) if r.chunk_tokens else 1 + np.arange(len(times)) * emitted
        rows_fed.append(rows)
        trajectories.append((times, r.prompt_tokens - 1 + made))
        gap = float(np.median(np.diff(times)))
        # from the chunk of the first step after t0 (the wave's first step of batch_size decodes left out)
        inside = np.flatnonzero((times >= t0 + EDGE * gap) & (times <= t1 + EDGE * gap))
        middle = (times[inside[0]] + times[inside[-1]]) / 2 if len(inside) >= 2 else (t0 + t1) / 2
        # cached mid-window: all it has but the step's input token
        cached.append(r.prompt_tokens + float(np.interp(middle, times, made)) - 1)
        if len(inside) < 2:
            continue
        a, b = inside[0], inside[-1]
        # steps in the window: its chunks; without drafts, where chunks know their tokens, its tokens (a
        # server that fell behind merges two steps' tokens into one chunk)
        count = float(made[b] - made[a]) if r.chunk_tokens and rows == 1 else float(b - a)
        if count > 0:
            spans += times[b] - times[a]
            steps += count
            estimates.append((times[b] - times[a]) / count)
            starts.append(times[a])
    if steps < MIN_WINDOW_STEPS * len(done) or not estimates:
        return None, int(steps / max(len(done), 1)), 0.0
    seconds = spans / steps
    spread = float(np.std(estimates) / np.mean(estimates)) if len(estimates) > 1 else 0.0
    window = int(round(steps / len(estimates)))
    shape = StepShape.of(rows_fed, cached)
    if reads is not None:
        # a padded read jumps a block as a context crosses one: its padding averaged over the window's steps
        # (each request's cache at each step's time), not read at the middle one
        at = np.linspace(float(np.median(starts)), t1, max(window, 2))
        caches = np.array([np.interp(at, times, cache) for times, cache in trajectories])     # [requests, steps]
        padding = float(np.mean([reads.padding(rows_fed, caches[:, j]) for j in range(len(at))]))
        shape = dataclasses.replace(shape, kv_tokens=shape.kv_tokens + padding,
                                    groups=float(reads.groups(rows_fed, cached)))
    return StepSample(shape, seconds), window, spread


def _per_step(r: RequestRecord, shared, batch_size: int) -> tuple[float, float]:
    """(tokens emitted, rows computed) per decode step of this request, from its own counters, else
    its share of the wave's (shared: (draft tokens, accepted tokens) over the wave), else none."""
    if r.draft_tokens is not None:
        drafted, accepted = r.draft_tokens, r.accepted_tokens or 0
    elif shared is not None:
        drafted, accepted = shared[0] / batch_size, shared[1] / batch_size
    else:
        drafted, accepted = 0, 0
    steps = max(r.output_tokens - 1 - accepted, 1)
    return max(r.output_tokens - 1, 1) / steps, 1.0 + drafted / steps


def prefill_sample(records: list[RequestRecord], max_num_batched_tokens: int | None = None,
                   paid: list[float] | None = None, reads: KVReads | None = None) -> StepSample | None:
    """Single requests of one prompt length, sent one after another: the median TTFT as the steps of
    the whole prompt (one logits row, no cached KV before it) plus the server's request overhead.
    max_num_batched_tokens: the server's token budget, a step's most prompt tokens (None: no limit).
    paid: seconds each request's steps paid for token counts the server had not run lately (counts.py),
    taken off its TTFT first. reads: how the server reads its KV cache (a later chunk reads the ones before)."""
    done = [(r, paid[i] if paid else 0.0) for i, r in enumerate(records) if not r.error and r.ttft is not None]
    if not done:
        return None
    prompt = float(np.median([r.prompt_tokens for r, _ in done]))
    chunks, cached = prompt_chunks(prompt, max_num_batched_tokens)
    # each chunk a step of its own: the features summed over the steps
    steps = [StepShape.of([n], [c], reads) for n, c in zip(chunks, cached)]
    return StepSample(sum(steps[1:], steps[0]), float(np.median([r.ttft - cost for r, cost in done])),
                      logits_rows=1.0, first_token=True, steps=len(chunks))


def prompt_chunks(prompt: float, budget: int | None) -> tuple[list[float], list[float]]:
    """(chunk lengths, tokens cached before each) of a prompt prefilled alone within a token budget:
    1,064 tokens at 512 -> ([512, 512, 40], [0, 512, 1024])."""
    if budget is None or prompt <= budget:
        return [prompt], [0.0]
    starts = np.arange(0, prompt, budget, dtype=float)
    return (np.minimum(starts + budget, prompt) - starts).tolist(), starts.tolist()
