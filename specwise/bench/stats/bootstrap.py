"""Paired bootstrap confidence intervals for ratios of two arms (numpy, seeded).

Pairs: request i was served by both arms, giving values a[i] (the arm) and b[i] (the
baseline). One resample draws n request indices with replacement and applies them to
both arms at once, so whatever makes one request slow in both arms (its prompt, its
output length) stays paired and cancels in the ratio. The ratio of each resample is
statistic(b) / statistic(a) for a latency (> 1: the arm is faster) and
statistic(a) / statistic(b) for a rate.

The interval is the *expanded* percentile interval (Hesterberg 2015, "What teachers
should know about the bootstrap"): the plain percentile interval is too narrow at small
n (it uses z rather than t, and a variance divided by n rather than n - 1), so its tail
levels are widened to alpha' / 2 = Phi(-sqrt(n / (n - 1)) * t(n - 1, 1 - alpha / 2)).
Worked example: at n = 10 and 95%, t = 2.262, alpha'/2 = Phi(-2.384) = 0.86%, so the
interval runs from the 0.86th to the 99.14th percentile of the resampled ratios.

Blocks (launched servers paired in blocks, bench/launch/pool.py): every request of a block
ran on the same server start, and a start's speed can differ from the next (placement,
caches, a neighbour), so requests within a block are not independent. There whole blocks
are resampled and n is the number of blocks: fewer blocks, wider intervals.
"""

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

RESAMPLES = 2000
DEFAULT_LEVEL = 0.95


@dataclass
class Interval:
    estimate: float
    low: float
    high: float
    n: int

    def half_width(self) -> float:
        """Relative half-width: (high - low) / 2 / estimate; 0.05 means +-5%."""
        return (self.high - self.low) / 2 / self.estimate if self.estimate else math.inf

    def to_list(self) -> list[float]:
        return [self.low, self.high]


def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile by the Cornish-Fisher expansion (within 1% for dof >= 3)."""
    z = NormalDist().inv_cdf(p)
    return (z + (z ** 3 + z) / (4 * dof) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * dof ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * dof ** 3))


def tail_levels(n: int, level: float) -> tuple[float, float]:
    """Percentiles (0-100) of the resampled ratios that bound the expanded interval."""
    t = t_quantile(1 - (1 - level) / 2, max(n - 1, 1))
    tail = NormalDist().cdf(-math.sqrt(n / max(n - 1, 1)) * t)
    return 100 * tail, 100 * (1 - tail)


def resample_indices(n: int, seed: int, resamples: int = RESAMPLES) -> np.ndarray:
    """(resamples, n) request indices; the first row is the sample itself."""
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, n, size=(resamples, n))
    indices[0] = np.arange(n)
    return indices


def resample_blocks(blocks, seed: int, resamples: int = RESAMPLES) -> tuple[list[np.ndarray], int]:
    """Block bootstrap: per resample, the pair indices of as many blocks as there are, drawn
    whole with replacement (the first resample is the sample itself); and the number of blocks,
    the n of the interval. Worked example: blocks [0, 0, 1, 1] -> resamples such as [2, 3, 2, 3]."""
    blocks = np.asarray(blocks)
    members = [np.flatnonzero(blocks == label) for label in np.unique(blocks)]
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(members), size=(resamples, len(members)))
    draws[0] = np.arange(len(members))
    return [np.concatenate([members[block] for block in row]) for row in draws], len(members)


def ratio_interval(estimates: np.ndarray, n: int, level: float) -> Interval | None:
    """From resampled ratios whose first entry is the sample's own ratio."""
    finite = estimates[np.isfinite(estimates)]
    if n < 2 or not np.isfinite(estimates[0]) or len(finite) < 10:
        return None
    low, high = np.percentile(finite, tail_levels(n, level))
    return Interval(float(estimates[0]), float(min(low, estimates[0])), float(max(high, estimates[0])), n)


def statistic(values: np.ndarray, name: str) -> np.ndarray:
    """Row-wise statistic of a (resamples, n) array: "mean" or "p50" / "p90" / "p99"."""
    if name == "mean":
        return values.mean(axis=1)
    return np.percentile(values, float(name[1:]), axis=1)
