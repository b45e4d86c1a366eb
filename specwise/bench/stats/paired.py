"""Paired comparison of an arm with the baseline at one load point (or one category of it).

Pairing: only requests that *both* arms completed count, matched by request id, so a
ratio never compares two different mixes of prompts. A --duration bound may leave some
requests served by one arm only; they are left out, and `Comparison.paired` says how
many pairs remain.

Ratios over the pairs, each with a paired bootstrap interval (bench/stats/bootstrap.py):
    latency key (tpot_mean, e2e_p50, ...)   statistic(baseline) / statistic(arm)   > 1: faster
    output_throughput, closed loop           (sum tokens_arm / sum e2e_arm) / (same for baseline)
        by Little's law, at a fixed concurrency c a server's request rate is c / mean e2e,
        so this is the throughput ratio at that concurrency, estimated per request;
    output_throughput, open loop             (sum tokens_arm / window_arm) / (same for baseline)
        the arrival rate sets throughput; windows are held fixed, tokens resampled.
    request_throughput                       the same with one per request instead of tokens.
Fewer than MIN_PAIRS pairs get no interval (and so no verdict but "can't tell"). A run paired
in blocks resamples whole blocks (bench/stats/bootstrap.py).
Worked example: pairs with e2e (arm, base) = (1, 2), (2, 2), (1, 2) seconds give an
e2e_mean ratio of 2 / 1.33 = 1.5x; a resample drawing pairs 1, 1, 2 gives 2 / 1.33 again.
"""

import zlib
from dataclasses import dataclass, field

import numpy as np

from specwise.bench.load.metrics import REQUEST_LATENCY, window
from specwise.bench.results import RequestRecord
from specwise.bench.stats.bootstrap import (DEFAULT_LEVEL, Interval, ratio_interval, resample_blocks,
                                            resample_indices, statistic)

THROUGHPUT = ("output_throughput", "request_throughput")
MIN_PAIRS = 5       # fewer pairs get no interval: a bootstrap of 2-4 requests knows almost nothing


@dataclass
class Comparison:
    paired: int
    intervals: dict[str, Interval] = field(default_factory=dict)


def pair(arm: list[RequestRecord], baseline: list[RequestRecord]) -> list[tuple[RequestRecord, RequestRecord]]:
    """(arm record, baseline record) for every request id both completed, in the arm's order."""
    done = {r.request_id: r for r in baseline if not r.error and not r.warmup}
    return [(r, done[r.request_id]) for r in arm if not r.error and not r.warmup and r.request_id in done]


def interval_keys(key: str) -> bool:
    """Keys a paired interval exists for: per-request latencies and the two throughputs."""
    return key in THROUGHPUT or (key.partition("_")[0] in REQUEST_LATENCY and key.partition("_")[2] in
                                 ("mean", "p50", "p90", "p99"))


def compare(pairs, keys, closed_loop: bool = True, level: float = DEFAULT_LEVEL, seed: int = 0,
            label: str = "", blocks: bool = False) -> Comparison:
    """Intervals for `keys` over `pairs`; `label` (arm, load, category) varies the seed per comparison.
    `blocks`: the run was paired in blocks: resample whole blocks (the arm's record's round)."""
    comparison = Comparison(paired=len(pairs))
    if len(pairs) < MIN_PAIRS:
        return comparison
    seed = (seed * 1_000_003 + zlib.crc32(label.encode())) % 2 ** 32
    for key in keys:
        interval = _interval(pairs, key, closed_loop, level, seed, blocks)
        if interval is not None:
            comparison.intervals[key] = interval
    return comparison


def _resamples(pairs, seed: int, blocks: bool):
    """(index rows, n): requests drawn with replacement, or whole blocks in a blocks run."""
    if blocks:
        return resample_blocks([a.round if a.round is not None else -1 for a, _ in pairs], seed)
    return resample_indices(len(pairs), seed), len(pairs)


def _by_row(values: np.ndarray, index, reduce) -> np.ndarray:
    """reduce(values[rows]) per resample; index is an array (equal rows) or a list (blocks)."""
    if isinstance(index, np.ndarray):
        return reduce(values[index])
    return np.array([reduce(values[rows][None, :])[0] for rows in index])


def _interval(pairs, key: str, closed_loop: bool, level: float, seed: int, blocks: bool = False) -> Interval | None:
    if key in THROUGHPUT:
        return _throughput(pairs, key == "output_throughput", closed_loop, level, seed, blocks)
    name, _, stat = key.partition("_")
    latency = REQUEST_LATENCY[name]
    pairs = [(a, b) for a, b in pairs if latency(a) is not None and latency(b) is not None]
    if len(pairs) < MIN_PAIRS:
        return None
    values = np.array([(latency(a), latency(b)) for a, b in pairs], dtype=float)
    index, n = _resamples(pairs, seed, blocks)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = (_by_row(values[:, 1], index, lambda v: statistic(v, stat))
                  / _by_row(values[:, 0], index, lambda v: statistic(v, stat)))
    return ratio_interval(ratios, n, level)


def _throughput(pairs, tokens: bool, closed_loop: bool, level: float, seed: int,
                blocks: bool = False) -> Interval | None:
    if len(pairs) < 2:
        return None
    amount = np.array([(a.output_tokens, b.output_tokens) if tokens else (1, 1) for a, b in pairs], dtype=float)
    if closed_loop:
        time = np.array([(a.e2e, b.e2e) for a, b in pairs], dtype=float)
    else:                                   # the same fixed window for every request of an arm
        spans = (window([a for a, _ in pairs]), window([b for _, b in pairs]))
        time = np.tile(np.array(spans, dtype=float) / len(pairs), (len(pairs), 1))
    index, n = _resamples(pairs, seed, blocks)

    def total(v):
        return v.sum(axis=1)

    with np.errstate(divide="ignore", invalid="ignore"):
        arm = _by_row(amount[:, 0], index, total) / _by_row(time[:, 0], index, total)
        base = _by_row(amount[:, 1], index, total) / _by_row(time[:, 1], index, total)
        return ratio_interval(arm / base, n, level)
