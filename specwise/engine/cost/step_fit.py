"""The least-squares fit of the linear step-cost model (engine/cost/linear_cost.py) to measured steps
(numpy only).

`fit` takes samples (a StepShape and its seconds[, logits rows, is a TTFT, steps]), solves for the
coefficients by least squares and keeps the residuals, so a profile that does not fit says so.
It refuses (one line) a sweep that cannot separate them: fewer than MIN_SAMPLES samples, or too
few distinct token counts or KV sizes (the columns would be collinear).

The least squares is relative (a 5 ms step and a 500 ms one weigh the same). A term that comes out
negative (noise the samples cannot tell from it: a KV token or a request costing less than nothing) is
fitted away (0) and the other coefficients solved again without it, so the fit is least squares kept
non-negative.

A sample may span several steps: a server whose token budget a prompt exceeds prefills it in chunks,
a step each (calibrate/samples.py `prefill_sample`). Its features are the steps' sums and its fixed
cost is paid once a step: `StepSample.steps` is the fixed column's value. Worked example, with the
coefficients of linear_cost.py's (20 ms, 0.5 ms a token, 2 us a KV token): a 1,064-token prompt at a
budget of 512 runs chunks of 512, 512 and 40 tokens over 0, 512 and 1,024 cached ones: 3 x 20 + 0.5 x
1,064 + 0.002 x 1,536 = 595.1 ms, where one step of the whole prompt would cost 552 ms (before the pairs).

Each coefficient comes with its standard error (`Fit.standard_errors`, printed and kept in the profile):
the relative least squares' covariance given the terms kept and the knee placed, how closely the
sweep's own steps pin it (not how far the machine moves between the sweep and a run).

The small-batch knee (linear_cost.py `min_tokens`): `fit` looks for it among the decode steps, below
the shortest prompt probed (a knee over a prefill would bend the prefill's line, which the attention
pairs are for), and keeps it only where it cuts the residuals by more than noise would (an F-test at
95%); a drafting server's fit takes the plain server's knee (calibrate/command.py), whose waves place it.

A step of one token's own cost (linear_cost.py `lone_token_s`, FitOptions.lone_token) is one column
more, 1 for a batch-1 decode, and is kept only where the same F-test says it cuts the residuals by
more than noise would. The knee is placed first, as without it: the drafting server's fit takes that
knee for its 1.5-row batch-1 waves, and a knee placed beside the column (the batch-1 waves then out of
its F-test) was lost in most recorded sweeps and their replays came out worse (docs/calculators.md).
A batch-1 cost of 4 ms pulls the knee half a token up (tests/test_step_fit.py).
"""

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from specwise.engine.cost.kv_reads import KVReads
from specwise.engine.cost.linear_cost import (ATTENTION_GROUP, ATTENTION_PAIR, COEFFICIENTS, LOGITS_ROW, LONE_TOKEN,
                                               REQUEST_OVERHEAD, LinearStepCost, StepShape)
from specwise.errors import ConfigError

MIN_SAMPLES = 6            # three coefficients, and as many samples again to see residuals
# of fit's design: logits rows, is a TTFT, attention pairs, attention groups, is one token (0-2: steps, tokens, KV)
OPTIONAL_COLUMNS = (3, 4, 5, 6, 7)
PAIRS_COLUMN = 5               # fitted only with FitOptions.fit_attention_pairs
LONE_COLUMN = 7                # fitted only with FitOptions.lone_token
# the profile's key of each column's coefficient (linear_cost.py)
COLUMN_KEYS = (*COEFFICIENTS, LOGITS_ROW, REQUEST_OVERHEAD, ATTENTION_PAIR, ATTENTION_GROUP, LONE_TOKEN)
NUMERIC_ZERO = 1e-9        # a coefficient this small against its column's scale is rounding, not a cost
KNEE_STEP = 0.25           # the knee's grid, tokens
MIN_UNDER_KNEE = 2         # samples below a knee, for it to be a level and not one sample's own residual
MIN_COUNTS_ABOVE = 3       # distinct token counts at or above it, for the line above it
# distinct decode token counts at or above it: with one, the knee trades the fixed cost against the cost per
# logits row (a decode's rows are its tokens, a prefill's one), and noise alone places it there
MIN_DECODES_ABOVE = 2
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
    lone_token: bool = field(default=True, metadata={"help": (
        "fit what a step of one token costs beyond the line and the knee (a CPU server's batch-1 decode "
        "sometimes costs more than its batch-4 one); off: a step of one token is a step of few tokens")})
    count_cost: bool = field(default=True, metadata={"help": (
        "calibrate --endpoint: charge a step of a token count the server has not run lately what the "
        "count probe measured (bench/calibrate/counts.py); --no-count-cost: a step costs by its shape alone")})
    admission_steps: bool = field(default=False, metadata={"help": (
        "calibrate --endpoint: fit the steps that prefilled each wave's prompts, read from its first tokens "
        "(bench/calibrate/admissions.py), beside its decode windows and the probes. Off by default: on the "
        "recorded vLLM sweeps they helped on balance, not in every sweep, and under a loaded machine's jitter "
        "they moved a known cost by a quarter (docs/calculators.md)")})
    server_steps: bool = field(default=True, metadata={"help": (
        "calibrate --endpoint: fit the steps the server says it ran during the sweep where it says them "
        "(`specwise serve`'s GET /steps; bench/calibrate/logged.py); --no-server-steps: what the client saw of "
        "them (its waves' chunks), as for any other server")})


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


@dataclass
class Fit:
    cost: LinearStepCost
    samples: list[StepSample]
    predicted: np.ndarray          # [samples] seconds the fitted model gives
    # each fitted coefficient's standard error, by its profile key (`_standard_errors`); absent: fitted away (0)
    standard_errors: dict[str, float] = field(default_factory=dict)

    @property
    def relative_residuals(self) -> np.ndarray:
        """[samples] predicted / measured - 1."""
        measured = np.array([s.seconds for s in self.samples])
        return self.predicted / measured - 1

    def summary(self) -> str:
        """One line: the coefficients and the residuals' median and worst."""
        residuals = np.abs(self.relative_residuals)
        return (f"{self.cost.description}; residuals over {len(self.samples)} steps: median "
                f"{np.median(residuals):.1%}, worst {residuals.max():.1%}" + self._errors_line())

    def relative_errors(self) -> dict[str, float]:
        """Each fitted coefficient's standard error over its value (a coefficient that came out 0: none)."""
        values = self.cost.to_json()
        return {key: error / values[key] for key, error in self.standard_errors.items() if values.get(key)}

    def _errors_line(self) -> str:
        if not self.standard_errors:
            return ""
        return "; standard errors: " + ", ".join(f"{key.removesuffix('_s').replace('_', ' ')} {error:.1%}"
                                                 for key, error in self.relative_errors().items())

    def residual_lines(self) -> list[str]:
        return [f"  {s.tokens:>8g} tokens {s.rows:>6g} logits rows {s.kv_tokens:>9g} KV {s.pairs:>10g} pairs  measured "
                f"{s.seconds * 1e3:8.2f} ms  fitted {p * 1e3:8.2f} ms  {r:+.1%}"
                + (f"  ({s.steps} steps)" if s.steps > 1 else "")
                for s, p, r in zip(self.samples, self.predicted, self.relative_residuals)]

    def to_json(self) -> dict:
        """The coefficients with the residuals' median and worst (a profile's "linear")."""
        residuals = np.abs(self.relative_residuals)
        return self.cost.to_json() | {"median_residual": float(np.median(residuals)),
                                      "worst_residual": float(residuals.max()), "steps": len(self.samples),
                                      "standard_errors": self.standard_errors}


def fit(samples: list[StepSample], options: FitOptions | None = None, kv_reads: KVReads | None = None,
        knee: float | None = None) -> Fit:
    """Least squares of seconds on (steps, tokens, KV tokens[, logits rows][, is a TTFT][, attention pairs]
    [, attention groups][, is one token]);
    ConfigError when the sweep is too short. An optional column is kept only where the samples tell it
    from the others: logits rows where prefill steps sit beside decode steps, the request overhead where
    TTFTs do, attention pairs (only with options.fit_attention_pairs) where prompts of several lengths
    do (a decode's pairs are its KV tokens plus its rows: no sweep of decodes alone can tell them apart), a
    step of one token's own cost (only with options.lone_token) where batch-1 decodes sit beside others.
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
    design = np.array([[float(s.steps), s.tokens, s.kv_tokens, s.rows, float(s.first_token), s.pairs, s.groups,
                        float(s.steps == 1 and s.tokens == 1)] for s in samples])
    seconds = np.array([s.seconds for s in samples])
    if _rank(design[:, :3]) < 3:
        raise ConfigError("the sweep is too short to fit fixed + per token + per KV token: token counts and KV "
                          "sizes move together; vary them apart")
    searched = knee is None         # a knee given (the plain server's, for its drafting fit) is no coefficient here
    if knee is None:
        # placed without the one-token column: beside it the batch-1 waves would leave the knee's F-test, and a
        # drafting server's fit takes this knee for its batch-1 waves, which have no such column of their own
        knee = _small_batch_knee(design, seconds, dataclasses.replace(options, lone_token=False))
    floored, knee_fitted = _floored(design, knee), searched and knee > 1
    kept, values, predicted = _lone_token(floored, seconds, options, knee_fitted)
    cost = LinearStepCost(values.get(0, 0.0), values.get(1, 0.0), values.get(2, 0.0),
                          per_logits_row_s=values.get(3, 0.0), request_overhead_s=values.get(4, 0.0),
                          per_attention_pair_s=values.get(5, 0.0), per_attention_group_s=values.get(6, 0.0),
                          kv_reads=kv_reads, min_tokens=knee, lone_token_s=values.get(LONE_COLUMN, 0.0))
    return Fit(cost, list(samples), predicted, _standard_errors(floored[:, kept], seconds, predicted, knee_fitted,
                                                                [COLUMN_KEYS[column] for column in kept]))


def _standard_errors(design: np.ndarray, seconds: np.ndarray, predicted: np.ndarray, knee: bool,
                     keys: list[str]) -> dict[str, float]:
    """Each kept coefficient's standard error, by its key: the relative least squares' covariance,
    s^2 (X'X)^-1 over the weighted design, s^2 the squared relative residuals over the spare samples (a
    fitted knee takes one more). Conditional on the columns kept and the knee placed, as the fit's
    coefficients are. Empty where no sample is spare."""
    spare = len(seconds) - design.shape[1] - int(knee)
    if spare < 1:
        return {}
    weighted = design / seconds[:, None]
    variance = _squared_error(predicted, seconds) / spare
    covariance = variance * np.linalg.pinv(weighted.T @ weighted)
    return {key: float(np.sqrt(max(covariance[i, i], 0.0))) for i, key in enumerate(keys)}


def _small_batch_knee(design: np.ndarray, seconds: np.ndarray, options: FitOptions) -> float:
    """The knee: the token count below which a step costs as many, chosen by least squares
    on a grid of KNEE_STEP tokens below the largest decode step and the shortest prompt probed (1: none). A
    knee is a candidate only where at least MIN_UNDER_KNEE samples lie below it and MIN_COUNTS_ABOVE
    distinct token counts at or above it hold the line, MIN_DECODES_ABOVE of them decodes' (samples not
    TTFTs), and it is kept only where it cuts the squared residuals by more than noise would: an F-test of
    the one term more at 95%, on at least KNEE_MIN_SPARE spare samples. Else, and with
    options.small_batch_floor off, 1."""
    if not options.small_batch_floor:
        return 1.0
    plain = _solve(design, seconds, options)
    per_step = design[:, 1] / design[:, 0]              # a chunked prefill's steps: each about its mean
    decode = design[:, 4] == 0
    # looked for among the decode steps, below the shortest prompt probed: where it would floor a prefill, it
    # would bend the prefill's line, which the attention pairs are for
    highest = min(per_step[decode].max(initial=1.0), per_step[~decode].min(initial=np.inf))
    plain_error = _squared_error(plain[2], seconds)
    best, best_kept, best_error = 1.0, plain[0], plain_error
    for knee in np.arange(1.0 + KNEE_STEP, highest, KNEE_STEP):
        if (np.sum(per_step < knee) < MIN_UNDER_KNEE
                or len(np.unique(per_step[per_step >= knee])) < MIN_COUNTS_ABOVE
                or len(np.unique(per_step[decode & (per_step >= knee)])) < MIN_DECODES_ABOVE):
            continue
        kept, _, predicted = _solve(_floored(design, knee), seconds, options)
        if (error := _squared_error(predicted, seconds)) < best_error:
            best, best_kept, best_error = float(knee), kept, error
    spare = len(seconds) - len(best_kept) - 1           # samples beyond the coefficients and the knee
    if best == 1.0 or not _term_kept(plain_error, best_error, spare):
        return 1.0
    return best


def _lone_token(design: np.ndarray, seconds: np.ndarray, options: FitOptions, knee: bool) -> tuple:
    """The solve with a step of one token's own cost where it cuts the squared residuals by more than noise
    would (the knee's F-test at 95%), else the solve without it. knee: the design's tokens are floored at
    a fitted knee (one parameter more, one spare sample less)."""
    without = _solve(design, seconds, dataclasses.replace(options, lone_token=False))
    if not options.lone_token:
        return without
    with_lone = _solve(design, seconds, options)
    spare = len(seconds) - len(with_lone[0]) - int(knee)
    kept = LONE_COLUMN in with_lone[0] and _term_kept(_squared_error(without[2], seconds),
                                                     _squared_error(with_lone[2], seconds), spare)
    return with_lone if kept else without


def _term_kept(error_without: float, error: float, spare: int) -> bool:
    """The F-test of one term more at 95%: it cuts the squared residuals by more than noise would, with at
    least KNEE_MIN_SPARE spare samples (beyond every coefficient, the term included)."""
    return spare >= KNEE_MIN_SPARE and error_without - error > _f_95(spare) * error / spare


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
        if (column == PAIRS_COLUMN and not options.fit_attention_pairs) or (column == LONE_COLUMN
                                                                              and not options.lone_token):
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
