"""Blocks (launched servers one at a time, restarted at each change of arm), against a fake engine whose
speed drifts from one server start to the next: over A | B B | A blocks the drift cancels and the block
bootstrap's interval holds the true ratio; the same arms run sequentially and unpaired (off fully, then
n-gram fully, as a user with one machine does today) read the drift as a difference.

The truth is the fake engine's own: at 30 tokens a request its n-gram arm (k = 4) emits 1, 2, 3, 4, 5
tokens in successive steps, 30 tokens in 10 steps against 30 plain steps. The compared figure is TPOT
(after the first chunk: 29 plain steps against 9), so a request's own overhead, which does not drift and
lands in its time to first token, stays out of it: at one speed the TPOT speedup is 29 / 9.
No assertion about speed: the drift is a factor on the fake's own step delay.
"""

from specwise.bench.evaluate import evaluate
from specwise.bench.results import read_records
from specwise.bench.stats.bootstrap import resample_blocks
from specwise.bench.stats.paired import compare, pair

from launch_fixtures import run_config, settings

TRUTH = 29 / 9          # steps after the first chunk: 29 plain, 9 n-gram
DRIFT = 0.5             # the nth server start runs its steps at 1 + 0.5 n times the first's step delay
BLOCKS = 4


def measured(outcome, arm: str) -> list:
    return [r for r in read_records(outcome.results_dir) if not r.warmup and r.arm == arm]


def test_blocks_interval_holds_the_truth_where_sequential_unpaired_runs_do_not(tmp_path, fake, monkeypatch):
    monkeypatch.setenv("FAKE_ENGINE_DRIFT", str(DRIFT))
    monkeypatch.setenv("FAKE_ENGINE_STEP_DELAY", "0.005")
    run = dict(concurrency="1", num_requests=8, max_tokens=30)

    monkeypatch.setenv("FAKE_ENGINE_DRIFT_FILE", str(tmp_path / "blocks-starts"))
    blocks = evaluate(run_config(tmp_path, output=str(tmp_path / "blocks"), **run), argv=[],
                      launch=settings(blocks=BLOCKS))
    paired = compare(pair(measured(blocks, "ngram-k4"), measured(blocks, "off")), ["tpot_mean"], blocks=True)
    interval = paired.intervals["tpot_mean"]
    assert (tmp_path / "blocks-starts").read_text() == "6"     # 2 warm-up starts, then one per change of arm
    assert interval.n == BLOCKS and interval.low <= TRUTH <= interval.high, interval

    monkeypatch.setenv("FAKE_ENGINE_DRIFT_FILE", str(tmp_path / "sequential-starts"))
    off = evaluate(run_config(tmp_path, methods="off", output=str(tmp_path / "off"), **run), argv=[],
                   launch=settings())
    ngram = evaluate(run_config(tmp_path, methods="ngram@4", output=str(tmp_path / "ngram"), **run), argv=[],
                     launch=settings())
    unpaired = compare(pair(measured(ngram, "ngram-k4"), measured(off, "off")), ["tpot_mean"])
    interval = unpaired.intervals["tpot_mean"]
    # n-gram ran one start of drift later: 3.2 / 1.5 = 2.1 on the drifted step delay (more with the fake's
    # per-step overhead, which does not drift), well below the truth
    assert interval.n == 8 and interval.high < TRUTH, interval


def test_block_resamples_draw_whole_blocks():
    rows, n = resample_blocks([0, 0, 1, 1, 2], seed=3, resamples=50)
    assert n == 3 and list(rows[0]) == [0, 1, 2, 3, 4]
    for row in rows:
        assert sorted(set(row) & {0, 1}) in ([], [0, 1]) and sorted(set(row) & {2, 3}) in ([], [2, 3])
