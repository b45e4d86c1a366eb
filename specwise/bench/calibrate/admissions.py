"""A wave's admission steps: the steps that prefilled its prompts, read from the client's first tokens.

A wave's requests reach an idle server a few milliseconds apart, and it starts its first step with
whichever have arrived: what that step held, and when it began, the client cannot know. The rest wait
and are then admitted first come, first served, as vLLM V1 and SGLang schedule: each step decodes the
sequences already running (one row each, plus their draft rows) and fills what is left of the token
budget (max_num_batched_tokens) with the waiting prompts in order, the last one cut where the budget
ends (chunked prefill). A request's first token comes at the end of the step that took its prompt's
last chunk, so the wave's first tokens fall in groups, one step apart, and

    step seconds = group k+1's first-token time - group k's          (each group's earliest)

a step whose shape follows from the groups before it. These are the steps a loaded server runs most
of its time in that the decode windows (samples.py) never see: many prompts at once, and prompts
beside decodes. vLLM for CPU on the 2-core machine (sweeps of 2026-12-07): waves of 64 x 32 and
16 x 256 tokens ran admission steps of about 2,000 prompt tokens in 12-15% more than the fit of its
decode windows and single-prompt probes said, and the evaluation after it took its ~2,000-token steps
6-13% longer than predicted (its TTFT and throughput at concurrency 16 and 64 off by as much).

Each group is checked against that rule before its step is used: the groups the rule makes from the
first group on (each request's prompt in first-token order, the budget less the decode rows) must be
the groups seen, up to the step sampled. A wave whose first group may have ended in a chunk (its
prompts and the next one's over the budget) gives none; a wave the rule does not explain stops at the
first step it gets wrong (a request that reached the server late, say).

Worked example, budget 2,048, no drafts: 64 prompts of 35 tokens, first tokens in groups of 1, 58
and 5. Step 2 decodes the first (1 row over 35 cached tokens), which leaves 2,047 tokens: 58 prompts
whole (2,030) and 17 tokens of the 59th, so 58 first tokens, as seen: step 2 is a sample of 2,048
tokens and 60 logits rows (the decode, 58 prompts, the cut one's chunk). Step 3 decodes 59 and takes
the 18 tokens left of the 59th and the 4 other prompts whole: 5 first tokens, as seen: a sample of 217
tokens and 64 logits rows. Had the groups been 1, 57 and 6 (a request that reached the server late),
neither step would be used. A step shorter than MIN_DECODE_STEPS decode steps is not kept either.
"""

from dataclasses import dataclass

import numpy as np

from specwise.bench.results import RequestRecord
from specwise.engine.cost.kv_reads import KVReads
from specwise.engine.cost.linear_cost import StepShape
from specwise.engine.cost.step_fit import StepSample

GROUP_GAP = 0.5     # first tokens closer than this share of a decode step came from one step
# an admission step is timed by two timestamps, a decode window by its many steps: one shorter than this many
# decode steps carries the client's jitter at several times a window's weight (the fake engine's 44 ms steps
# moved its fitted coefficients by up to 3%), and what it holds, a window and the probes say
MIN_DECODE_STEPS = 4


@dataclass
class _Request:
    prompt: int             # prompt tokens
    rows: float             # rows a decode step feeds it: 1 + its draft rows
    emitted: float          # tokens a decode step gives it
    left: float = 0.0       # prompt tokens not yet prefilled
    first_step: int = -1    # the step that gave its first token


def admission_steps(records: list[RequestRecord], decode_seconds: float, budget: int | None,
                    per_step: list[tuple[float, float]], reads: KVReads | None = None) -> list[StepSample]:
    """The wave's admission steps after its first (module docstring). records: the wave's requests, all
    finished; decode_seconds: its decode step (the groups' scale); budget: the server's token budget (None:
    no limit); per_step: each record's (tokens emitted, rows fed) a decode step (samples.py `_per_step`)."""
    firsts = np.array([r.send_time + r.chunk_times[0] for r in records])
    order = np.argsort(firsts, kind="stable")
    groups = _groups(firsts[order], GROUP_GAP * decode_seconds)
    requests = [_Request(records[i].prompt_tokens, per_step[i][1], per_step[i][0], records[i].prompt_tokens)
                for i in order]
    limit = float("inf") if budget is None else budget
    first = groups[0][1]
    if first < len(requests) and sum(r.prompt for r in requests[:first + 1]) > limit:
        return []           # the first step may have cut a chunk: where the rest began is unknown
    for r in requests[:first]:
        r.left, r.first_step = 0, 0
    samples, admitted = [], first
    for step, ((t_before, _), (t_after, size)) in enumerate(zip(groups, groups[1:]), start=1):
        running = [r for r in requests if r.first_step >= 0]
        room = limit - sum(r.rows for r in running)
        new, cached, done = [], [], []
        for r in requests[admitted:]:
            if room <= 0:
                break
            take = min(r.left, room)
            new.append(take)
            cached.append(r.prompt - r.left)
            room -= take
            r.left -= take
            if r.left == 0:
                done.append(r)
        if len(done) != size:
            break               # the rule does not make the groups seen: from here the shapes are unknown
        decode_new = [r.rows for r in running]
        # a running sequence holds its prompt and what it made since its first token, less the step's input
        decode_cached = [r.prompt + (step - r.first_step - 1) * r.emitted for r in running]
        if t_after - t_before >= MIN_DECODE_STEPS * decode_seconds:
            shape = StepShape.of(decode_new + new, decode_cached + cached, reads)
            samples.append(StepSample(shape, t_after - t_before, logits_rows=sum(decode_new) + len(new)))
        for r in done:
            r.first_step = step
        admitted += size
    return samples


def _groups(times: np.ndarray, gap: float) -> list[tuple[float, int]]:
    """Sorted first-token times -> (earliest time, size) of each run of times less than gap apart. The
    earliest: the client reads a group's streams one after another, so its later times are late by the
    reading of the ones before (a group of 15 by more than its median's share, one of 1 by nothing)."""
    cuts = np.flatnonzero(np.diff(times) >= gap) + 1
    return [(float(run[0]), len(run)) for run in np.split(times, cuts)]
