"""Blocks (launched servers one at a time, restarted at each change of arm): a server's speed that
drifts from one start to the next cancels over A | B B | A blocks, and the block bootstrap's
interval holds the truth; two sequential unpaired runs read the drift as a difference.
Constructed records with a known truth, no timing."""

import numpy as np

from specwise.bench.results import RequestRecord
from specwise.bench.stats.bootstrap import resample_blocks
from specwise.bench.stats.paired import compare, pair

TRUTH = 1.5             # the arm's true e2e speedup over the baseline
DRIFT = 0.25            # each server start is 25% slower than the one before (linear drift)
BLOCKS, PER_BLOCK = 8, 6


def record(arm: str, request: int, e2e: float, block: int) -> RequestRecord:
    return RequestRecord(arm=arm, method="off" if arm == "off" else "ngram", load_kind="concurrency", load_value=1,
                         category="chat", request_id=f"r{request}", prompt_tokens=10, output_tokens=32,
                         send_time=0.0, ttft=0.05, e2e=e2e, round=block)


def run(schedule: str, seed: int = 0):
    """(arm records, baseline records): every request's own length, server start drift, 3% noise."""
    rng = np.random.default_rng(seed)
    lengths = rng.uniform(0.5, 2.0, BLOCKS * PER_BLOCK)
    starts = {"off": 0, "ngram": 0}
    arm, base, start, running = [], [], -1, None
    for block in range(BLOCKS if schedule == "blocks" else 1):
        order = ["off", "ngram"] if block % 2 == 0 else ["ngram", "off"]
        size = PER_BLOCK if schedule == "blocks" else BLOCKS * PER_BLOCK
        for name in order:
            if running != name:                 # a restart at each change of arm
                start, running = start + 1, name
            starts[name] = start
            for index in range(block * size, (block + 1) * size):
                speed = (1 + DRIFT * start) * rng.lognormal(0, 0.03)
                e2e = lengths[index] * speed / (TRUTH if name == "ngram" else 1)
                (arm if name == "ngram" else base).append(record(name, index, e2e, block))
    return arm, base


def test_blocks_interval_holds_the_truth_despite_drift():
    arm, base = run("blocks")
    interval = compare(pair(arm, base), ["e2e_mean"], blocks=True).intervals["e2e_mean"]
    assert interval.n == BLOCKS
    assert interval.low <= TRUTH <= interval.high


def test_sequential_unpaired_runs_read_the_drift_as_a_difference():
    arm, base = run("sequential")
    interval = compare(pair(arm, base), ["e2e_mean"]).intervals["e2e_mean"]
    assert interval.high < TRUTH            # one restart of drift: 1.5 / 1.25 = 1.2
    assert abs(interval.estimate - TRUTH / (1 + DRIFT)) < 0.05


def test_block_resamples_draw_whole_blocks():
    rows, n = resample_blocks([0, 0, 1, 1, 2], seed=3, resamples=50)
    assert n == 3 and list(rows[0]) == [0, 1, 2, 3, 4]
    for row in rows:
        assert sorted(set(row) & {0, 1}) in ([], [0, 1]) and sorted(set(row) & {2, 3}) in ([], [2, 3])
