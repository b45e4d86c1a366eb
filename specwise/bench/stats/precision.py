"""--precision: when a load point has measured enough.

After each round the runner asks: for every arm against the baseline, over the requests
both completed, is each compared ratio's interval half-width (relative to its estimate)
at most `precision`? Worked example: precision 0.05 and a TPOT speedup of 1.40x
[1.35, 1.46]: half-width (1.46 - 1.35) / 2 / 1.40 = 3.9% <= 5%, that ratio is done.
Never before MIN_PAIRS pairs per arm (an interval on a handful of requests is itself noisy).
"""

from specwise.bench.stats.bootstrap import DEFAULT_LEVEL
from specwise.bench.stats.paired import compare, pair

MIN_PAIRS = 8


def precise_enough(records: dict[str, list], baseline: str, keys: list[str], precision: float,
                   level: float = DEFAULT_LEVEL, seed: int = 0, blocks: bool = False) -> bool:
    """`records`: the load point's records so far, by arm name."""
    base = records.get(baseline, [])
    closed_loop = bool(base) and base[0].load_kind == "concurrency"
    for arm, mine in records.items():
        if arm == baseline:
            continue
        pairs = pair(mine, base)
        if len(pairs) < MIN_PAIRS:
            return False
        intervals = compare(pairs, keys, closed_loop, level, seed, label=arm, blocks=blocks).intervals
        if any(key not in intervals or intervals[key].half_width() > precision for key in keys):
            return False
    return True


class PrecisionCheck:
    """The runner's stop test for one run (bench/load/runner.py calls it with records by arm)."""

    def __init__(self, baseline: str, keys: list[str], precision: float, level: float, seed: int,
                 blocks: bool = False):
        self.baseline, self.keys, self.precision, self.level, self.seed = baseline, keys, precision, level, seed
        self.blocks = blocks

    def __call__(self, records: dict[str, list]) -> bool:
        return precise_enough(records, self.baseline, self.keys, self.precision, self.level, self.seed,
                              self.blocks)
