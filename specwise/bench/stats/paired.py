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
Fewer than MIN_PAIRS pairs get no interval (and so no verdict but "can't tell").
Worked example: pairs with e2e (arm, base) = (1, 2), (2, 2), (1, 2) seconds give an
e2e_mean ratio of 2 / 1.33 = 1.5x; a resample drawing pairs 1, 1, 2 gives 2 / 1.33 again.
"""

import zlib
from dataclasses import dataclass, field

import numpy as np

from specwise.bench.load.metrics import request_tpot, window
from specwise.bench.results import RequestRecord
from specwise.bench.stats.bootstrap import DEFAULT_LEVEL, Interval, ratio_interval, resample_indices, statistic

THROUGHPUT = ("output_throughput", "request_throughput")
MIN_PAIRS = 5       # fewer pairs get no interval: a bootstrap of 2-4 requests knows almost nothing
_VALUE = {"ttft": lambda r: r.ttft, "tpot": request_tpot, "e2e": lambda r: r.e2e}


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
    return key in THROUGHPUT or (key.partition("_")[0] in _VALUE and key.partition("_")[2] in
                                 ("mean", "p50", "p90", "p99"))


def compare(pairs, keys, closed_loop: bool = True, level: float = DEFAULT_LEVEL, seed: int = 0,
            label: str = "") -> Comparison:
    """Intervals for `keys` over `pairs`; `label` (arm, load, category) varies the seed per comparison."""
    comparison = Comparison(paired=len(pairs))
    if len(pairs) < MIN_PAIRS:
        return comparison
    seed = (seed * 1_000_003 + zlib.crc32(label.encode())) % 2 ** 32
    for key in keys:
        interval = _interval(pairs, key, closed_loop, level, seed)
        if interval is not None:
            comparison.intervals[key] = interval
    return comparison


def _interval(pairs, key: str, closed_loop: bool, level: float, seed: int) -> Interval | None:
    if key in THROUGHPUT:
        return _throughput(pairs, key == "output_throughput", closed_loop, level, seed)
    name, _, stat = key.partition("_")
    values = [(_VALUE[name](a), _VALUE[name](b)) for a, b in pairs]
    values = np.array([pair for pair in values if pair[0] is not None and pair[1] is not None], dtype=float)
    if len(values) < MIN_PAIRS:
        return None
    index = resample_indices(len(values), seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = statistic(values[:, 1][index], stat) / statistic(values[:, 0][index], stat)
    return ratio_interval(ratios, len(values), level)


def _throughput(pairs, tokens: bool, closed_loop: bool, level: float, seed: int) -> Interval | None:
    if len(pairs) < 2:
        return None
    amount = np.array([(a.output_tokens, b.output_tokens) if tokens else (1, 1) for a, b in pairs], dtype=float)
    if closed_loop:
        time = np.array([(a.e2e, b.e2e) for a, b in pairs], dtype=float)
    else:                                   # the same fixed window for every request of an arm
        spans = (window([a for a, _ in pairs]), window([b for _, b in pairs]))
        time = np.tile(np.array(spans, dtype=float) / len(pairs), (len(pairs), 1))
    index = resample_indices(len(pairs), seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        arm = amount[:, 0][index].sum(axis=1) / time[:, 0][index].sum(axis=1)
        base = amount[:, 1][index].sum(axis=1) / time[:, 1][index].sum(axis=1)
        return ratio_interval(arm / base, len(pairs), level)
