"""The linear step-cost model (numpy only), for the simulator (sim/flat.py), the calculators and a
calibrated profile (engine/cost/step_profile.py); engine/cost/step_fit.py fits it to measured steps.

A forward pass over a flat batch costs

    seconds = fixed + per_token x batched tokens + per_kv_token x KV tokens read
              [+ per_logits_row x logits rows] [+ per_attention_pair x attention pairs]

batched tokens = every row the step computes (decode rows, draft rows, prompt chunk tokens);
KV tokens read = the cached tokens its attention reads, summed over the sequences (each once per
pass, as FlashAttention-like kernels read them; a server that reads sequences in padded groups, as
ours does, reads more: `kv_reads`, engine/cost/kv_reads.py, counts that). This is the form published step-time
predictors fit per engine and drafter; it holds for one engine on one machine over the range of
shapes it was fitted on, not beyond. logits rows = the rows whose next-token distribution the
step computes and samples: every decode and draft row, but only the last token of a prompt. The
LM head, the sampler and the server's per-token output work cost per logits row, so on a CPU a
decode row costs several times a prompt token; the fourth term is fitted only when the samples
separate the two (prefill steps beside decode steps), else it is 0 and a row is a row.

attention pairs = the (query, key) pairs its attention computes (engine/cost/step_cost.py
`attention_pairs`): a sequence fed n rows after c cached tokens computes n x c + n (n + 1) / 2.
Reading the cache is memory traffic, once a sequence; a pair is arithmetic, once a row. A decode
row computes c + 1 pairs, so there a pair only adds to what a cached token costs; a prompt chunk
computes n (n + 1) / 2 pairs among its own tokens, which makes a prefill's time convex in its
length (our server on the 2-core machine: TTFTs of 53, 156 and 667 ms at 30, 229 and 914 tokens,
which the straight line through them misses by 11% at 229 and 914 tokens), and a verification of
1 + k rows reads c cached tokens but computes (1 + k) c pairs. Counted always, fitted only when
asked (FitOptions.fit_attention_pairs: `calibrate --endpoint` asks where the server prefilled each probe
in one step, bench/calibrate/command.py) and where the samples separate it (prefill steps, or steps of
several rows a sequence, beside decodes of one), else 0: against our server, whose longer prompts run
in chunks that read the earlier ones through its grouped cache reads, the recorded replays came out
worse with it; against vLLM it cut the worst TTFT in every sweep (docs/calculators.md). `StepShape.of`
counts all three features from each sequence's rows and cache, for every side alike: the simulator's
steps (sim/flat.py), a server's waves and prefills (bench/calibrate/samples.py) and our engine's timed
steps (engine_cli.py).

A request also waits outside any step: the HTTP round trip, tokenizing the prompt, the first
chunk's way back. A server's TTFT is that request overhead plus its prefill step; where the samples
hold TTFTs (`first_token`) beside plain steps, the overhead is fitted too, and the simulator admits
each request that much after it is sent.

Worked example: fixed 20 ms, 0.5 ms a token, 2 us a KV token: 8 sequences verifying 1 + 4 rows
each over 300 cached tokens cost 20 + 0.5 x 40 + 0.002 x 2,400 = 44.8 ms; at 0.1 us an attention
pair more, their 8 x 1,515 pairs add 1.2 ms, and a 914-token prompt's 418,155 pairs 41.8 ms.

A small batch costs as a few rows do (`min_tokens`, the small-batch knee): the weights are read from
memory whatever the rows, and until the rows' arithmetic outlasts that read, a step of fewer tokens
costs what one at the knee does. Every recorded sweep of vLLM and of ours on the 2-core machine shows
it: batch-1 and batch-4 decodes within a millisecond or two of each other, so the line through waves of
1, 4, 16 and 64 sequences put all 24 batch-1 waves of twelve sweeps low (by 3-16%) and all 24 batch-4
waves high (by 1-15%). Worked example, 20 ms + 1 ms a token with a knee of 6: batch 1 and batch 4
decodes cost 26 ms, batch 8 28 ms. engine/cost/step_fit.py looks for it among a sweep's decode steps.

A step of one token (one sequence decoding, nothing drafted) may cost more than the floor and the
line say (`lone_token_s`): in 42 of the 44 batch-1 waves of twenty-two recorded sweeps of vLLM and of
ours on the 2-core machine (2026-12-05/06) the fit without it came out low, by up to 16%, with or
without a knee, and a batch-1 wave sometimes cost more than a batch-4 one beside it (vLLM 34.7 against
32.1 ms, ours 30.9 against 29.8). step_fit.py keeps it where an F-test says the batch-1 decodes need it.
Worked example, the line above with 4 ms a lone token: a batch-1 decode over 300 cached tokens costs
20 + 0.5 + 0.6 + 4 = 25.1 ms, a batch-2 one over 300 each 20 + 1 + 1.2 = 22.2 ms.

A step of a token count the server has not run lately may cost more than its shape: an eager CPU
server builds its matmuls' kernels per shape and keeps the last few (calibrate/counts.py measures
both). `new_count_s` is that cost and `count_memory` how many distinct counts the server keeps; the
simulator charges it to each step whose token count is not among the last `count_memory` it ran
(`RecentCounts`). It is measured apart, not fitted (`with_counts` adds it to a fitted cost), and a
calibration takes it off the times that paid it before the fit (bench/calibrate/counts.py).

A server's speculating configuration (vLLM with n-gram drafting, say) costs more per step than
its verification rows alone: the drafter runs on the same machine. `drafting` holds a separate
fit per drafting method, fitted on that server's own steps; `for_method` picks it.
"""

import dataclasses
import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from specwise.engine.cost.kv_reads import KVReads
from specwise.engine.cost.step_cost import StepCostModel, attention_pairs, check_step_shape
from specwise.errors import ConfigError

# a profile's keys ("linear" in engine/cost/step_profile.py)
COEFFICIENTS = ("fixed_s", "per_token_s", "per_kv_token_s")
LOGITS_ROW = "per_logits_row_s"          # optional: per sampled row (0 when absent)
REQUEST_OVERHEAD = "request_overhead_s"   # optional: a request's own latency outside any step (0 when absent)
ATTENTION_PAIR = "per_attention_pair_s"   # optional: per (query, key) pair attention computes (0 when absent)
ATTENTION_GROUP = "per_attention_group_s"  # optional: per group the attention reads the cache in (kv_reads.py)
NEW_COUNT = "new_count_s"      # optional, measured apart: a step of a token count not run lately (0 when absent)
COUNT_MEMORY = "count_memory"  # the distinct token counts the server keeps kernels for
KV_READS = "kv_reads"      # optional: how the server reads the cache (kv_reads.py); absent: its own tokens
MIN_TOKENS = "min_tokens"  # optional: a step of fewer tokens costs as this many (the small-batch knee; 1 when absent)
LONE_TOKEN = "lone_token_s"  # optional: a step of exactly one token costs this much more (0 when absent)


@dataclass(frozen=True)
class StepShape:
    """What one step computes, the linear model's features: batched tokens, KV tokens read and
    attention pairs. Fields are numbers, or arrays over several steps (step_times)."""
    tokens: float
    kv_tokens: float
    pairs: float
    groups: float = 0.0         # the groups the server's attention reads the cache in (kv_reads.py); 0: not counted

    @classmethod
    def of(cls, new_tokens, cached_tokens, reads: KVReads | None = None) -> "StepShape":
        """Sequences each fed new_tokens[i] rows after cached_tokens[i] cached tokens, summed over the
        last axis (a number: one sequence). Worked example: decodes over 100 and 200 cached tokens
        beside a 50-token chunk after 30, of([1, 1, 50], [100, 200, 30]): 52 tokens, 330 KV tokens
        read, 101 + 201 + 2,775 = 3,077 pairs. reads: how the server reads the cache (kv_reads.py),
        for one step; None: each sequence reads its own cached tokens."""
        new, cached = np.broadcast_arrays(np.atleast_1d(np.asarray(new_tokens, dtype=float)),
                                          np.atleast_1d(np.asarray(cached_tokens, dtype=float)))
        kv_tokens, groups = cached.sum(-1), 0.0
        if reads is not None:
            if new.ndim != 1:
                raise ValueError("KV reads are counted one step at a time")
            padding, groups = reads.read(new, cached)
            kv_tokens = kv_tokens + padding
        return cls(new.sum(-1), kv_tokens, attention_pairs(new, cached).sum(-1), float(groups))

    def __add__(self, other: "StepShape") -> "StepShape":
        """Two steps' features together (a prompt prefilled in chunks, one sample)."""
        return StepShape(self.tokens + other.tokens, self.kv_tokens + other.kv_tokens, self.pairs + other.pairs,
                         self.groups + other.groups)

    def scaled(self, count: float) -> "StepShape":
        """`count` sequences like this one (each feature is a sum over sequences)."""
        return StepShape(self.tokens * count, self.kv_tokens * count, self.pairs * count)


class LinearStepCost(StepCostModel):
    def __init__(self, fixed_s: float, per_token_s: float, per_kv_token_s: float, description: str = "",
                 per_logits_row_s: float = 0.0, drafting: dict | None = None, request_overhead_s: float = 0.0,
                 per_attention_pair_s: float = 0.0, new_count_s: float = 0.0, count_memory: int = 0,
                 kv_reads: KVReads | None = None, per_attention_group_s: float = 0.0, min_tokens: float = 1.0,
                 lone_token_s: float = 0.0):
        self.kv_reads = kv_reads            # how the server reads the cache: the KV feature counts it so
        self.min_tokens = max(min_tokens, 1.0)       # the small-batch knee: fewer tokens cost as this many
        self.lone_token_s = lone_token_s             # a step of one token costs this much more
        if new_count_s < 0 or count_memory < 0 or (new_count_s > 0 and count_memory < 1):
            raise ConfigError("a new token count's cost must be >= 0, with a memory of at least 1 count")
        self.new_count_s, self.count_memory = new_count_s, count_memory
        self.fixed_s, self.per_token_s, self.per_kv_token_s = fixed_s, per_token_s, per_kv_token_s
        self.per_logits_row_s, self.request_overhead_s = per_logits_row_s, request_overhead_s
        self.per_attention_pair_s, self.per_attention_group_s = per_attention_pair_s, per_attention_group_s
        self.drafting: dict[str, LinearStepCost] = drafting or {}
        row = f" + {per_logits_row_s * 1e3:.3f} ms/logits row" if per_logits_row_s else ""
        row += f" + {per_attention_pair_s * 1e9:.2f} ns/attention pair" if per_attention_pair_s else ""
        row += f" + {per_attention_group_s * 1e3:.2f} ms/attention group" if per_attention_group_s else ""
        knee = self.min_tokens
        row += f"; a step of under {knee:g} tokens costs as {knee:g}" if knee > 1 else ""
        row += f"; {lone_token_s * 1e3:.2f} ms more a step of one token" if lone_token_s else ""
        row += f"; {request_overhead_s * 1e3:.2f} ms a request" if request_overhead_s else ""
        row += (f"; {new_count_s * 1e3:.1f} ms a step of a token count not among the last {count_memory}"
                if new_count_s else "")
        row += f"; {kv_reads.describe()}" if kv_reads else ""
        self.description = description or (f"linear: {fixed_s * 1e3:.2f} ms + {per_token_s * 1e3:.3f} ms/token "
                                           f"+ {per_kv_token_s * 1e6:.3f} us/KV token{row}")

    def seconds(self, shape: StepShape, logits_rows=None) -> np.ndarray:
        """One step's seconds (the request overhead is no part of a step)."""
        # logits_rows None: every token is sampled (a decode or verification step)
        tokens = np.asarray(shape.tokens, dtype=float)
        rows = tokens if logits_rows is None else np.asarray(logits_rows, dtype=float)
        return np.maximum(self.fixed_s + self.per_token_s * np.maximum(tokens, self.min_tokens)
                          + self.lone_token_s * (tokens == 1) + self.per_logits_row_s * rows
                          + self.per_kv_token_s * np.asarray(shape.kv_tokens, dtype=float)
                          + self.per_attention_pair_s * np.asarray(shape.pairs, dtype=float)
                          + self.per_attention_group_s * np.asarray(shape.groups, dtype=float), 0.0)

    def with_counts(self, new_count_s: float, count_memory: int) -> "LinearStepCost":
        """This cost with a step of a token count not among the last count_memory costing new_count_s more."""
        counted = LinearStepCost.from_json(self.to_json() | {NEW_COUNT: new_count_s,
                                                             COUNT_MEMORY: count_memory if new_count_s else 0})
        counted.drafting = self.drafting
        return counted

    def for_method(self, method: str) -> "LinearStepCost":
        """The fit of the server speculating with this method, where the profile has one."""
        return self.drafting.get(method, self)

    def step_times(self, batch_size: int, tokens_per_seq: int, total_context) -> np.ndarray:
        check_step_shape(batch_size, tokens_per_seq)
        # every sequence at the mean context: the features are linear in each sequence's context
        mean = np.asarray(total_context, dtype=float)[..., None] / batch_size
        shape = StepShape.of(tokens_per_seq, mean).scaled(batch_size)
        if self.kv_reads is not None:      # sequences alike: the groups of a batch that reads a cache, not its padding
            groups = math.ceil(batch_size / self.kv_reads.group_size)
            shape = dataclasses.replace(shape, groups=np.where(np.asarray(total_context, dtype=float) > 0, groups, 0.0))
        return self.seconds(shape)

    def prefill_time(self, prompt_lens) -> float:
        return float(self.seconds(StepShape.of(prompt_lens, 0.0), len(prompt_lens)))

    def to_json(self) -> dict:
        out = dict(zip(COEFFICIENTS, (self.fixed_s, self.per_token_s, self.per_kv_token_s)))
        extra = {LOGITS_ROW: self.per_logits_row_s, REQUEST_OVERHEAD: self.request_overhead_s,
                 ATTENTION_PAIR: self.per_attention_pair_s, ATTENTION_GROUP: self.per_attention_group_s}
        if self.new_count_s:
            extra |= {NEW_COUNT: self.new_count_s, COUNT_MEMORY: self.count_memory}
        if self.kv_reads:
            extra[KV_READS] = self.kv_reads.to_json()
        if self.min_tokens > 1:
            extra[MIN_TOKENS] = self.min_tokens
        extra[LONE_TOKEN] = self.lone_token_s
        return out | {key: value for key, value in extra.items() if value}

    @classmethod
    def from_json(cls, data: dict, description: str = "") -> "LinearStepCost":
        """{"fixed_s", "per_token_s", "per_kv_token_s"[, "per_logits_row_s"][, "request_overhead_s"]
        [, "per_attention_pair_s"][, "per_attention_group_s"][, "new_count_s", "count_memory"][, "kv_reads": {...}]
        [, "min_tokens"][, "lone_token_s"]
        [, "drafting": {method: {...}}]};
        ValueError when a coefficient is missing or not a number."""
        try:
            values = [float(data[key]) for key in COEFFICIENTS]
            row, overhead, pair, group, new = (float(data.get(key, 0.0)) for key in (
                LOGITS_ROW, REQUEST_OVERHEAD, ATTENTION_PAIR, ATTENTION_GROUP, NEW_COUNT))
            memory = int(data.get(COUNT_MEMORY, 0))
            knee = float(data.get(MIN_TOKENS, 1.0))
            lone = float(data.get(LONE_TOKEN, 0.0))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"needs {', '.join(COEFFICIENTS)} as numbers") from None
        if new < 0 or memory < 0 or (new > 0 and memory < 1):
            raise ValueError(f"needs {NEW_COUNT} >= 0 with a {COUNT_MEMORY} of at least 1")
        drafting = {method: cls.from_json(fit, f"{description} ({method})" if description else "")
                    for method, fit in (data.get("drafting") or {}).items()}
        return cls(*values, description=description, per_logits_row_s=row, drafting=drafting,
                   request_overhead_s=overhead, per_attention_pair_s=pair, new_count_s=new, count_memory=memory,
                   kv_reads=KVReads.from_json(data.get(KV_READS)), per_attention_group_s=group, min_tokens=knee,
                   lone_token_s=lone)


class RecentCounts:
    """The token counts a server ran lately, as its kernel cache keeps them: the last `memory` distinct
    ones (least recently run out first). `cost(tokens)`: what a step of that many tokens pays for its
    count (new_count_s where it is not among them, else 0), and it is then the most recent. Worked
    example, memory 2: counts 5, 7, 5, 9, 7 pay new, new, 0, new, new (9 put 7 out)."""

    def __init__(self, new_count_s: float, memory: int):
        self.new_count_s, self.memory = new_count_s, memory
        self.counts: OrderedDict[float, None] = OrderedDict()

    def cost(self, tokens: float) -> float:
        if not self.new_count_s:
            return 0.0
        if tokens in self.counts:
            self.counts.move_to_end(tokens)
            return 0.0
        self.counts[tokens] = None
        if len(self.counts) > self.memory:
            self.counts.popitem(last=False)
        return self.new_count_s
