"""The linear step-cost model and its least-squares fit (numpy only).

A forward pass over a flat batch costs

    seconds = fixed + per_token x batched tokens + per_kv_token x KV tokens read

batched tokens = every row the step computes (decode rows, draft rows, prompt chunk tokens);
KV tokens read = the cached tokens its attention reads, summed over the sequences (each once per
pass, as FlashAttention-like kernels read them). This is the form published step-time
predictors fit per engine and drafter; it holds for one engine on one machine over the range of
shapes it was fitted on, not beyond.

Worked example: fixed 20 ms, 0.5 ms a token, 2 us a KV token: 8 sequences verifying 1 + 4 rows
each over 300 cached tokens cost 20 + 0.5 x 40 + 0.002 x 2,400 = 44.8 ms.

`fit` takes (batched tokens, KV tokens read, seconds) samples, solves for the three coefficients
by least squares and keeps the residuals, so a profile that does not fit says so. It refuses
(one line) a sweep that cannot separate them: fewer than MIN_SAMPLES samples, or too few
distinct token counts or KV sizes (the columns would be collinear).
"""

from dataclasses import dataclass

import numpy as np

from specwise.engine.step_cost import StepCostModel, check_step_shape
from specwise.errors import ConfigError

MIN_SAMPLES = 6            # three coefficients, and as many samples again to see residuals
COEFFICIENTS = ("fixed_s", "per_token_s", "per_kv_token_s")


@dataclass(frozen=True)
class StepSample:
    tokens: float              # batched tokens in the step
    kv_tokens: float           # cached tokens its attention read, summed over the batch
    seconds: float


class LinearStepCost(StepCostModel):
    def __init__(self, fixed_s: float, per_token_s: float, per_kv_token_s: float, description: str = ""):
        self.fixed_s, self.per_token_s, self.per_kv_token_s = fixed_s, per_token_s, per_kv_token_s
        self.description = description or (f"linear: {fixed_s * 1e3:.2f} ms + {per_token_s * 1e3:.3f} ms/token "
                                           f"+ {per_kv_token_s * 1e6:.3f} us/KV token")

    def seconds(self, tokens, kv_tokens) -> np.ndarray:
        return np.maximum(self.fixed_s + self.per_token_s * np.asarray(tokens, dtype=float)
                          + self.per_kv_token_s * np.asarray(kv_tokens, dtype=float), 0.0)

    def step_times(self, batch_size: int, tokens_per_seq: int, total_context) -> np.ndarray:
        check_step_shape(batch_size, tokens_per_seq)
        return self.seconds(batch_size * tokens_per_seq, total_context)

    def prefill_time(self, prompt_lens) -> float:
        return float(self.seconds(float(np.sum(prompt_lens)), 0.0))

    def to_json(self) -> dict:
        return dict(zip(COEFFICIENTS, (self.fixed_s, self.per_token_s, self.per_kv_token_s)))


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
        return [f"  {s.tokens:>8g} tokens {s.kv_tokens:>9g} KV  measured {s.seconds * 1e3:8.2f} ms  "
                f"fitted {p * 1e3:8.2f} ms  {r:+.1%}"
                for s, p, r in zip(self.samples, self.predicted, self.relative_residuals)]


def fit(samples: list[StepSample]) -> Fit:
    """Least squares of seconds on (1, tokens, KV tokens); ConfigError when the sweep is too short."""
    tokens = {s.tokens for s in samples}
    kv = {s.kv_tokens for s in samples}
    if len(samples) < MIN_SAMPLES or len(tokens) < 2 or len(kv) < 2:
        raise ConfigError(f"the sweep is too short to fit fixed + per token + per KV token: {len(samples)} steps "
                          f"over {len(tokens)} token counts and {len(kv)} KV sizes (need {MIN_SAMPLES} steps, "
                          f"2 of each)")
    if any(s.seconds <= 0 for s in samples):
        raise ConfigError("a step time of zero or less cannot be fitted")
    design = np.array([[1.0, s.tokens, s.kv_tokens] for s in samples])
    seconds = np.array([s.seconds for s in samples])
    if np.linalg.matrix_rank(design) < 3:
        raise ConfigError("the sweep is too short to fit fixed + per token + per KV token: token counts and KV "
                          "sizes move together; vary them apart")
    # relative least squares: a 5 ms step and a 500 ms one weigh the same
    weights = 1.0 / seconds
    coefficients, *_ = np.linalg.lstsq(design * weights[:, None], seconds * weights, rcond=None)
    cost = LinearStepCost(*(float(c) for c in coefficients))
    return Fit(cost, list(samples), design @ coefficients)


def grid_samples(batch_sizes, tokens_per_seq, context_lens, seconds) -> list[StepSample]:
    """A step profile's grid (seconds[b][t][c]) as samples: batch x t tokens over batch x c KV tokens."""
    return [StepSample(b * t, b * c, float(seconds[i][j][m]))
            for i, b in enumerate(batch_sizes) for j, t in enumerate(tokens_per_seq)
            for m, c in enumerate(context_lens)]
