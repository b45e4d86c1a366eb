"""How far the server moved between its calibration sweep and a measured run (`simulate --validate`).

A replay's error is two errors together: the fit's (the linear cost missing the steps it was fitted
on) and the machine's (the same server taking longer or shorter over the same step a few minutes
later, on a shared machine). One step tells them apart: the plain arm's decode at concurrency 1,
which the run measured (every chunk of a lone request is one batch-1 decode step) and the sweep
measured too (its batch-1 waves, calibrate/sweep.py). So:

    moved = the run's step / the sweep's step - 1     (the server, between the two)
    fit   = the fitted step / the sweep's step - 1     (the model, at the sweep's own steps)

The run's step is the median gap between consecutive chunks over its c=1 requests (validate.py's
step column at that point), at the mean context those gaps read; the sweep's is the mean of its
batch-1 waves, each brought to that context by the fit's cost a KV token. Worked example: the run's
gaps have a median of 35.1 ms over about 211 cached tokens; the sweep's batch-1 waves took 31.6 ms
over 61 tokens and 32.5 ms over 257, at 3 us a KV token 32.05 and 32.36 ms at 211, mean 32.2 ms; the
fit gives 29.7 ms there. The server moved +9.0%, the fit is -7.8% from the sweep's waves, and the
replay's batch-1 step -15.4% from the run's: no fit of that sweep could have come closer than 9%.
"""

import statistics
from dataclasses import dataclass

import numpy as np

from specwise.bench.results import RequestRecord, read_records, read_run_info
from specwise.engine.cost.linear_cost import LinearStepCost, StepShape
from specwise.engine.cost.step_profile import PLAIN_ENDPOINT, calibration_waves
from specwise.sim.validate import median_step


@dataclass(frozen=True)
class BatchOneDrift:
    arm: str
    run_step_s: float       # the run's median chunk gap at c=1
    context: float          # the cached tokens those gaps read, mean
    sweep_step_s: float     # the sweep's batch-1 waves, at that context
    fitted_step_s: float    # the fit, at that context
    waves: int

    @property
    def moved(self) -> float:
        return self.run_step_s / self.sweep_step_s - 1

    @property
    def fit(self) -> float:
        return self.fitted_step_s / self.sweep_step_s - 1

    def describe(self) -> str:
        return (f"between the sweep and the run: {self.arm}'s batch-1 decode step took {self.run_step_s * 1e3:.1f} ms "
                f"in the run (c=1, the median chunk gap, about {self.context:.0f} cached tokens) against "
                f"{self.sweep_step_s * 1e3:.1f} ms in the sweep (its {self.waves} batch-1 waves, at that context): "
                f"the server moved {self.moved:+.1%}; the fit is {self.fit:+.1%} from the sweep's waves "
                f"({self.fitted_step_s / self.run_step_s - 1:+.1%} from the run)")


def batch_one_drift(records: list[RequestRecord], arm: str, waves: list[dict],
                    cost: LinearStepCost) -> BatchOneDrift | None:
    """The drift of `arm`'s batch-1 decode step, from its c=1 records and the sweep's batch-1 waves
    (the profile's "calibration"."waves" of the plain endpoint, each {"kv_tokens", "decode_seconds"});
    None where the run has no such point or the sweep no such wave."""
    run_step = median_step(records, arm, "concurrency", 1)
    if run_step is None or not waves:
        return None
    contexts = []
    for record in records:
        point = (record.arm, record.load_kind, record.load_value)
        if point != (arm, "concurrency", 1) or record.error or record.warmup:
            continue
        emitted = np.cumsum(record.chunk_tokens or [1] * len(record.chunk_times))
        # the step that sent chunk j + 1 fed the last token emitted over the prompt and the tokens before it
        contexts += [record.prompt_tokens + float(emitted[j]) - 1 for j in range(len(record.chunk_times) - 1)]
    context = statistics.mean(contexts)
    sweep = statistics.mean(wave["decode_seconds"] + cost.per_kv_token_s * (context - wave["kv_tokens"])
                            for wave in waves)
    fitted = float(cost.seconds(StepShape.of([1], [context], cost.kv_reads)))
    return BatchOneDrift(arm, run_step, context, sweep, fitted, len(waves))


def run_drift(results_dir, profile, cost) -> BatchOneDrift | None:
    """The drift of a run's plain arm (its baseline) from the sweep that wrote `profile` (a
    `calibrate --endpoint` profile); None for a cost of any other kind."""
    if profile is None or not isinstance(cost, LinearStepCost):
        return None
    arm = read_run_info(results_dir).get("baseline") or PLAIN_ENDPOINT
    return batch_one_drift(read_records(results_dir), arm, calibration_waves(profile, 1), cost)
