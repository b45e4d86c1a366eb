"""The linear step-cost model and its least-squares fit (numpy only).

A forward pass over a flat batch costs

    seconds = fixed + per_token x batched tokens + per_kv_token x KV tokens read
              [+ per_logits_row x logits rows] [+ per_attention_pair x attention pairs]

batched tokens = every row the step computes (decode rows, draft rows, prompt chunk tokens);
KV tokens read = the cached tokens its attention reads, summed over the sequences (each once per
pass, as FlashAttention-like kernels read them; a server that reads sequences in padded groups, as
ours does, reads more: `kv_reads`, engine/kv_reads.py, counts that). This is the form published step-time
predictors fit per engine and drafter; it holds for one engine on one machine over the range of
shapes it was fitted on, not beyond. logits rows = the rows whose next-token distribution the
step computes and samples: every decode and draft row, but only the last token of a prompt. The
LM head, the sampler and the server's per-token output work cost per logits row, so on a CPU a
decode row costs several times a prompt token; the fourth term is fitted only when the samples
separate the two (prefill steps beside decode steps), else it is 0 and a row is a row.

attention pairs = the (query, key) pairs its attention computes (engine/step_cost.py
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
each request that much after it is sent. A term that comes out negative (noise the samples cannot
tell from it: a KV token or a request costing less than nothing) is fitted away (0) and the other
coefficients solved again without it, so the fit is least squares kept non-negative.

Worked example: fixed 20 ms, 0.5 ms a token, 2 us a KV token: 8 sequences verifying 1 + 4 rows
each over 300 cached tokens cost 20 + 0.5 x 40 + 0.002 x 2,400 = 44.8 ms; at 0.1 us an attention
pair more, their 8 x 1,515 pairs add 1.2 ms, and a 914-token prompt's 418,155 pairs 41.8 ms.

A sample may span several steps: a server whose token budget a prompt exceeds prefills it in
chunks, a step each (calibrate/samples.py `prefill_sample`). Its features are the steps' sums and
its fixed cost is paid once a step: `StepSample.steps` is the fixed column's value. Worked example,
with the coefficients above: a 1,064-token prompt at a budget of 512 runs chunks of 512, 512 and 40
tokens over 0, 512 and 1,024 cached ones: 3 x 20 + 0.5 x 1,064 + 0.002 x 1,536 = 595.1 ms, where one
step of the whole prompt would cost 552 ms (before the pairs).

A small batch costs as a few rows do (`min_tokens`, the small-batch knee): the weights are read from
memory whatever the rows, and until the rows' arithmetic outlasts that read, a step of fewer tokens
costs what one at the knee does. Every recorded sweep of vLLM and of ours on the 2-core machine shows
it: batch-1 and batch-4 decodes within a millisecond or two of each other, so the line through waves
of 1, 4, 16 and 64 sequences put all 24 batch-1 waves of twelve sweeps low (by 3-16%) and all 24
batch-4 waves high (by 1-15%). Worked example, 20 ms + 1 ms a token with a knee of 6: batch 1 and
batch 4 decodes cost 26 ms, batch 8 28 ms. `fit` looks for it among the decode steps, below the
shortest prompt probed (a knee over a prefill would bend the prefill's line, which the attention pairs
are for), and keeps it only where it cuts the residuals by more than noise would (an F-test at 95%); a
drafting server's fit takes the plain server's knee (calibrate/command.py), whose waves place it.

`fit` takes samples (a StepShape and its seconds[, logits rows, is a TTFT, steps]), solves for the
coefficients by least squares and keeps the residuals, so a profile that does not fit says so.
It refuses (one line) a sweep that cannot separate them: fewer than MIN_SAMPLES samples, or too
few distinct token counts or KV sizes (the columns would be collinear).

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
from dataclasses import dataclass, field

import numpy as np

from specwise.engine.kv_reads import KVReads
from specwise.engine.step_cost import StepCostModel, attention_pairs, check_step_shape
from specwise.errors import ConfigError

MIN_SAMPLES = 6            # three coefficients, and as many samples again to see residuals
COEFFICIENTS = ("fixed_s", "per_token_s", "per_kv_token_s")
LOGITS_ROW = "per_logits_row_s"          # optional: per sampled row (0 when absent)
REQUEST_OVERHEAD = "request_overhead_s"   # optional: a request's own latency outside any step (0 when absent)
ATTENTION_PAIR = "per_attention_pair_s"   # optional: per (query, key) pair attention computes (0 when absent)
ATTENTION_GROUP = "per_attention_group_s"  # optional: per group the attention reads the cache in (kv_reads.py)
NEW_COUNT = "new_count_s"      # optional, measured apart: a step of a token count not run lately (0 when absent)
COUNT_MEMORY = "count_memory"  # the distinct token counts the server keeps kernels for
KV_READS = "kv_reads"      # optional: how the server reads the cache (kv_reads.py); absent: its own tokens
# of fit's design: logits rows, is a TTFT, attention pairs, attention groups (0-2: steps, tokens, KV)
OPTIONAL_COLUMNS = (3, 4, 5, 6)
PAIRS_COLUMN = 5               # fitted only with FitOptions.fit_attention_pairs
NUMERIC_ZERO = 1e-9        # a coefficient this small against its column's scale is rounding, not a cost
MIN_TOKENS = "min_tokens"  # optional: a step of fewer tokens costs as this many (the small-batch knee; 1 when absent)
KNEE_STEP = 0.25           # the knee's grid, tokens
MIN_UNDER_KNEE = 2         # samples below a knee, for it to be a level and not one sample's own residual
MIN_COUNTS_ABOVE = 3       # distinct token counts at or above it, for the line above it
KNEE_MIN_SPARE = 3         # samples beyond the coefficients and the knee, for its F-test (_f_95 within 8% from 3)


@dataclass
class FitOptions:
    """Which optional terms `fit` may add (`specwise calibrate` flags, both for our engine and --endpoint)."""
    fit_attention_pairs: bool | None = field(default=None, metadata={"help": (
        "fit a cost per attention pair (a prefill convex in its length); off: pairs are counted, not costed. "
        "Default: calibrate --endpoint fits them where the server prefilled every probe in one step (vLLM, "
        "SGLang at their token budgets), not where a longer one ran in chunks (ours); our engine's calibrate "
        "does not (docs/calculators.md)")})
    small_batch_floor: bool = field(default=True, metadata={"help": (
        "fit a knee below which a step costs as many tokens as at the knee (the weights are read whatever the "
        "rows: a CPU server's batch-1 and batch-4 decodes cost alike); off: the line down to one token")})
    count_cost: bool = field(default=True, metadata={"help": (
        "calibrate --endpoint: charge a step of a token count the server has not run lately what the "
        "count probe measured (bench/calibrate/counts.py); --no-count-cost: a step costs by its shape alone")})


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


@dataclass(frozen=True)
class StepSample:
    shape: StepShape
    seconds: float
    logits_rows: float | None = None     # rows sampled; None: every token (a decode or verification step)
    first_token: bool = False            # a time to first token: the step plus the server's request overhead
    steps: int = 1                       # forward passes the seconds span (a prompt prefilled in chunks)

    @property
    def tokens(self) -> float:
        return self.shape.tokens

    @property
    def kv_tokens(self) -> float:
        return self.shape.kv_tokens

    @property
    def pairs(self) -> float:
        return self.shape.pairs

    @property
    def groups(self) -> float:
        return self.shape.groups

    @property
    def rows(self) -> float:
        return self.tokens if self.logits_rows is None else self.logits_rows


class LinearStepCost(StepCostModel):
    def __init__(self, fixed_s: float, per_token_s: float, per_kv_token_s: float, description: str = "",
                 per_logits_row_s: float = 0.0, drafting: dict | None = None, request_overhead_s: float = 0.0,
                 per_attention_pair_s: float = 0.0, new_count_s: float = 0.0, count_memory: int = 0,
                 kv_reads: KVReads | None = None, per_attention_group_s: float = 0.0, min_tokens: float = 1.0):
        self.kv_reads = kv_reads            # how the server reads the cache: the KV feature counts it so
        self.min_tokens = max(min_tokens, 1.0)       # the small-batch knee: fewer tokens cost as this many
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
                          + self.per_logits_row_s * rows
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
        return out | {key: value for key, value in extra.items() if value}

    @classmethod
    def from_json(cls, data: dict, description: str = "") -> "LinearStepCost":
        """{"fixed_s", "per_token_s", "per_kv_token_s"[, "per_logits_row_s"][, "request_overhead_s"]
        [, "per_attention_pair_s"][, "per_attention_group_s"][, "new_count_s", "count_memory"][, "kv_reads": {...}]
        [, "drafting": {method: {...}}]};
        ValueError when a coefficient is missing or not a number."""
        try:
            values = [float(data[key]) for key in COEFFICIENTS]
            row, overhead, pair, group, new = (float(data.get(key, 0.0)) for key in (
                LOGITS_ROW, REQUEST_OVERHEAD, ATTENTION_PAIR, ATTENTION_GROUP, NEW_COUNT))
            memory = int(data.get(COUNT_MEMORY, 0))
            knee = float(data.get(MIN_TOKENS, 1.0))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"needs {', '.join(COEFFICIENTS)} as numbers") from None
        if new < 0 or memory < 0 or (new > 0 and memory < 1):
            raise ValueError(f"needs {NEW_COUNT} >= 0 with a {COUNT_MEMORY} of at least 1")
        drafting = {method: cls.from_json(fit, f"{description} ({method})" if description else "")
                    for method, fit in (data.get("drafting") or {}).items()}
        return cls(*values, description=description, per_logits_row_s=row, drafting=drafting,
                   request_overhead_s=overhead, per_attention_pair_s=pair, new_count_s=new, count_memory=memory,
                   kv_reads=KVReads.from_json(data.get(KV_READS)), per_attention_group_s=group, min_tokens=knee)


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


@dataclass
class Fit:
    cost: LinearStepCost
    samples: list[StepSample]
    predicted: np.ndarray          # [samples] seconds the fitted model gives

    @property
    def relative_residuals(self) -> np.ndarray:
        """[samples] predicted / measured - 1."""
        measured = np.array([s.seconds for s in self.samples])
        return self.predicted / measured - 1

    def summary(self) -> str:
        """One line: the coefficients and the residuals' median and worst."""
        residuals = np.abs(self.relative_residuals)
        return (f"{self.cost.description}; residuals over {len(self.samples)} steps: median "
                f"{np.median(residuals):.1%}, worst {residuals.max():.1%}")

    def residual_lines(self) -> list[str]:
        return [f"  {s.tokens:>8g} tokens {s.rows:>6g} logits rows {s.kv_tokens:>9g} KV {s.pairs:>10g} pairs  measured "
                f"{s.seconds * 1e3:8.2f} ms  fitted {p * 1e3:8.2f} ms  {r:+.1%}"
                + (f"  ({s.steps} steps)" if s.steps > 1 else "")
                for s, p, r in zip(self.samples, self.predicted, self.relative_residuals)]

    def to_json(self) -> dict:
        """The coefficients with the residuals' median and worst (a profile's "linear")."""
        residuals = np.abs(self.relative_residuals)
        return self.cost.to_json() | {"median_residual": float(np.median(residuals)),
                                      "worst_residual": float(residuals.max()), "steps": len(self.samples)}


def fit(samples: list[StepSample], options: FitOptions | None = None, kv_reads: KVReads | None = None,
        knee: float | None = None) -> Fit:
    """Least squares of seconds on (steps, tokens, KV tokens[, logits rows][, is a TTFT][, attention pairs]);
    ConfigError when the sweep is too short. An optional column is kept only where the samples tell it
    from the others: logits rows where prefill steps sit beside decode steps, the request overhead where
    TTFTs do, attention pairs (only with options.fit_attention_pairs) where prompts of several lengths
    do (a decode's pairs are its KV tokens plus its rows: no sweep of decodes alone can tell them apart).
    kv_reads: how the samples' KV tokens were counted (kv_reads.py), kept with the cost. knee: the small-batch
    knee to fit with (another fit's: the same server drafting); None: looked for (`_small_batch_knee`)."""
    options = options or FitOptions()
    tokens = {s.tokens for s in samples}
    kv = {s.kv_tokens for s in samples}
    if len(samples) < MIN_SAMPLES or len(tokens) < 2 or len(kv) < 2:
        raise ConfigError(f"the sweep is too short to fit fixed + per token + per KV token: {len(samples)} steps "
                          f"over {len(tokens)} token counts and {len(kv)} KV sizes (need {MIN_SAMPLES} steps, "
                          f"2 of each)")
    if any(s.seconds <= 0 for s in samples):
        raise ConfigError("a step time of zero or less cannot be fitted")
    design = np.array([[float(s.steps), s.tokens, s.kv_tokens, s.rows, float(s.first_token), s.pairs, s.groups]
                       for s in samples])
    seconds = np.array([s.seconds for s in samples])
    if _rank(design[:, :3]) < 3:
        raise ConfigError("the sweep is too short to fit fixed + per token + per KV token: token counts and KV "
                          "sizes move together; vary them apart")
    if knee is None:
        knee, (kept, values, predicted) = _small_batch_knee(design, seconds, options)
    else:
        kept, values, predicted = _solve(_floored(design, knee), seconds, options)
    cost = LinearStepCost(values.get(0, 0.0), values.get(1, 0.0), values.get(2, 0.0),
                          per_logits_row_s=values.get(3, 0.0), request_overhead_s=values.get(4, 0.0),
                          per_attention_pair_s=values.get(5, 0.0), per_attention_group_s=values.get(6, 0.0),
                          kv_reads=kv_reads, min_tokens=knee)
    return Fit(cost, list(samples), predicted)


def _small_batch_knee(design: np.ndarray, seconds: np.ndarray, options: FitOptions) -> tuple[float, tuple]:
    """(knee, the solve at it): the token count below which a step costs as many, chosen by least squares
    on a grid of KNEE_STEP tokens below the largest decode step and the shortest prompt probed (1: none). A
    knee is a candidate only where at least MIN_UNDER_KNEE samples lie below it and MIN_COUNTS_ABOVE
    distinct token counts at or above it hold the line, and it is kept only where it cuts the squared
    residuals by more than noise would: an F-test of the one term more at 95%, on at least KNEE_MIN_SPARE
    spare samples. Else, and with options.small_batch_floor off, 1."""
    plain = _solve(design, seconds, options)
    if not options.small_batch_floor:
        return 1.0, plain
    per_step = design[:, 1] / design[:, 0]              # a chunked prefill's steps: each about its mean
    # looked for among the decode steps, below the shortest prompt probed: where it would floor a prefill, it
    # would bend the prefill's line, which the attention pairs are for
    highest = min(per_step[design[:, 4] == 0].max(initial=1.0), per_step[design[:, 4] == 1].min(initial=np.inf))
    plain_error = _squared_error(plain[2], seconds)
    best, best_error = (1.0, plain), plain_error
    for knee in np.arange(1.0 + KNEE_STEP, highest, KNEE_STEP):
        if (np.sum(per_step < knee) < MIN_UNDER_KNEE
                or len(np.unique(per_step[per_step >= knee])) < MIN_COUNTS_ABOVE):
            continue
        solved = _solve(_floored(design, knee), seconds, options)
        if (error := _squared_error(solved[2], seconds)) < best_error:
            best, best_error = (float(knee), solved), error
    spare = len(seconds) - len(best[1][0]) - 1           # samples beyond the coefficients and the knee
    if best[0] == 1.0 or spare < KNEE_MIN_SPARE or (plain_error - best_error) <= _f_95(spare) * best_error / spare:
        return 1.0, plain
    return best


def _floored(design: np.ndarray, knee: float) -> np.ndarray:
    """The design with each step's tokens at least the knee (a sample of several steps: knee tokens a step)."""
    floored = design.copy()
    floored[:, 1] = np.maximum(design[:, 1], knee * design[:, 0])
    return floored


def _squared_error(predicted: np.ndarray, seconds: np.ndarray) -> float:
    """The fit's objective: relative residuals, squared and summed."""
    return float(np.sum((predicted / seconds - 1) ** 2))


def _f_95(dof: int) -> float:
    """The 95th percentile of F(1, dof), Student's t at 97.5% squared, t by its Cornish-Fisher expansion to
    1/dof^2: 6.5 at 5 spare samples (6.61 exactly), 4.95 at 10 (4.96), 3.84 as they grow."""
    z = 1.959964
    t = z + (z ** 3 + z) / (4 * dof) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * dof ** 2)
    return t * t


def _solve(design: np.ndarray, seconds: np.ndarray,
           options: FitOptions) -> tuple[list[int], dict[int, float], np.ndarray]:
    """(columns kept, their non-negative coefficients, [samples] predicted seconds)."""
    # the optional terms, each kept only where the samples separate it from the terms kept before it
    kept = [0, 1, 2]
    for column in OPTIONAL_COLUMNS:
        if column == PAIRS_COLUMN and not options.fit_attention_pairs:
            continue
        if _rank(design[:, kept + [column]]) == len(kept) + 1:
            kept.append(column)
    # relative least squares: a 5 ms step and a 500 ms one weigh the same
    weights = 1.0 / seconds
    while True:
        solved, *_ = np.linalg.lstsq(design[:, kept] * weights[:, None], seconds * weights, rcond=None)
        values = dict(zip(kept, (float(c) for c in solved)))
        # a term that comes out below zero (a KV token or a request that costs less than nothing: noise the
        # samples cannot tell from that term) is fitted away, 0, and the others solved again without it:
        # least squares kept non-negative, so that no model step gets cheaper as it grows and no
        # coefficient is solved beside a term the simulator would drop (flat.py admits after an overhead
        # only when it is positive). Where every term comes out non-negative, the plain least squares.
        negative = [column for column in kept if values[column] < -NUMERIC_ZERO * _scale(design, column, seconds)]
        if not negative:
            break
        kept.remove(min(negative, key=lambda column: values[column] * _scale(design, column, seconds)))
    return kept, {column: max(value, 0.0) for column, value in values.items()}, design[:, kept] @ solved


def _scale(design: np.ndarray, column: int, seconds: np.ndarray) -> float:
    """Seconds per unit of a column at which it moves the largest sample by its own length: a
    coefficient below -NUMERIC_ZERO of this is negative, not floating-point rounding of a zero."""
    return float(seconds.max() / max(np.abs(design[:, column]).max(), 1e-300))


def _rank(columns: np.ndarray) -> int:
    """Rank with each column scaled to its largest value (tokens and KV tokens differ by 1000x)."""
    scale = np.abs(columns).max(axis=0)
    return int(np.linalg.matrix_rank(columns / np.where(scale > 0, scale, 1.0)))


def grid_samples(batch_sizes, tokens_per_seq, context_lens, seconds, reads: KVReads | None = None) -> list[StepSample]:
    """A step profile's grid (seconds[b][t][c]) as samples: batch sequences of t rows over c cached
    tokens each (every row sampled, as the profiler computes logits at every position); reads: how the
    engine read the cache (kv_reads.py)."""
    return [StepSample(StepShape.of(np.full(b, t), np.full(b, c), reads), float(seconds[i][j][m]))
            for i, b in enumerate(batch_sizes) for j, t in enumerate(tokens_per_seq)
            for m, c in enumerate(context_lens)]
