"""The steps a server says it ran during the sweep (`specwise serve`'s GET /steps), as StepSamples.

A client sees a server's steps through its streamed chunks (samples.py): a wave's decode window is a
mean over steps whose shapes it infers, and the steps that admit a wave, a prompt chunk beside decodes,
it does not see at all. A server that logs its steps (engine/step_log.py) says each one whole: the rows
each sequence was fed over its cache, the rows it sampled, the seconds it took. Fitted on those, the model
sees every step of the sweep as it was, the prompt chunks among decodes too; the client's prefill probes'
TTFTs stay in the fit for what no step holds, the request overhead (a TTFT = the prompt's steps + the
overhead, engine/cost/step_fit.py).

Why (docs/calculators.md, 2026-12-07): the client's fit takes a prompt token's cost from its probes, where
our server's 1,024-token probe ran its second chunk, 512 tokens over 512 cached, in 2.74-2.88 s against
1.86-1.93 s for its first; it predicted an evaluation's steps with a prompt chunk 14-22% high, the same
model fitted on the server's 448 logged sweep steps within 1-2%. Replayed end to end (09:24), a sweep
fitted on its steps: TTFT, TPOT and throughput medians 2.7, 2.6 and 1.2%; as the client saw it 5.6, 9.3
and 6.7%.

A step of a token count the server had not run lately paid what the count probe measured (counts.py),
where it ran: it comes off the logged seconds of each step whose count was new, walked in order
(RecentCounts), as the simulator charges it.

Worked example: two logged steps, a 40-token prompt alone (0.19 s) and 4 decodes over 50 cached tokens
each beside it in the next (0.08 s): samples of 40 tokens, 1 logits row, no KV, 820 pairs; and 4 tokens,
4 logits rows, 200 KV tokens (more where the server reads in padded groups), 204 pairs.
"""

import numpy as np

from specwise.bench.calibrate.counts import CountCost
from specwise.engine.cost.kv_reads import KVReads
from specwise.engine.cost.linear_cost import LinearStepCost, RecentCounts, StepShape
from specwise.engine.cost.step_fit import StepSample

# (first, last) batch sizes the residual table groups a kind of step by
BATCHES = [(1, 1), (2, 7), (8, 16), (17, 47), (48, 1 << 20)]


def logged_samples(lines: list[dict], reads: KVReads | None, counts: CountCost | None = None) -> list[StepSample]:
    """Each logged step as a sample (in the order they ran), less its new token count's cost where the count
    probe measured one."""
    recent = RecentCounts(counts.new_count_s, counts.memory) if counts and counts.new_count_s else None
    samples = []
    for line in lines:
        shape = StepShape.of(line["fed"], line["cached"], reads)
        paid = recent.cost(float(shape.tokens)) if recent else 0.0
        samples.append(StepSample(shape, max(float(line["seconds"]) - paid, 1e-6), logits_rows=float(line["sampled"])))
    return samples


def residual_table(cost: LinearStepCost, lines: list[dict], samples: list[StepSample]) -> list[str]:
    """Measured against fitted by kind of step (decodes alone, or beside a prompt chunk) and batch size: the
    count, the medians, the median error and the error in their total time (predicted / measured - 1)."""
    predicted = np.array([float(cost.seconds(s.shape, s.logits_rows)) for s in samples])
    measured = np.array([s.seconds for s in samples])
    error = predicted / measured - 1
    batch = np.array([len(line["fed"]) for line in lines])
    decodes = np.array([not line.get("prompt_tokens") for line in lines])
    out = [f"  {'steps':<28} {'count':>6} {'measured':>10} {'fitted':>10} {'median err':>11} {'time err':>9}"]
    for kind, mask in (("decodes", decodes), ("with a prompt chunk", ~decodes)):
        for low, high in BATCHES:
            chosen = mask & (batch >= low) & (batch <= high)
            if chosen.any():
                span = f"{low}" if low == high else f"{low}-{high}" if high < 1 << 20 else f"{low}+"
                out.append(f"  {kind + ', batch ' + span:<28} {chosen.sum():>6} "
                           f"{np.median(measured[chosen]) * 1e3:>8.1f}ms {np.median(predicted[chosen]) * 1e3:>8.1f}ms "
                           f"{np.median(error[chosen]):>+11.1%} "
                           f"{predicted[chosen].sum() / measured[chosen].sum() - 1:>+9.1%}")
    return out
