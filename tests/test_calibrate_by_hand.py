"""`calibrate --endpoint`'s arithmetic by hand, no server: a wave's decode step from its chunk times
(bench/calibrate/samples.py) and its admission steps from its first tokens (admissions.py), a probe's
prefill steps, the count probe and what the prefill probes paid for new counts (counts.py), and when the
attention pairs are fitted (command.py)."""

import numpy as np
import pytest

from specwise.bench.calibrate.admissions import admission_steps
from specwise.bench.calibrate.command import with_pairs_decided
from specwise.bench.calibrate.counts import CountCost, count_cost, count_requests, paid
from specwise.bench.calibrate.samples import prefill_sample, prompt_chunks, wave_steps
from specwise.bench.calibrate.sweep import Probe, SweepDesign
from specwise.bench.results import RequestRecord
from specwise.engine.cost.linear_cost import StepShape
from specwise.engine.cost.step_fit import FitOptions, StepSample
from specwise.errors import ConfigError


def test_the_count_probe_by_hand():
    """counts.py's worked example: d = 12, 14, 11, 13, 1, -2, 0, 1 ms at j = 0..7 -> the step after j = 3,
    memory 8 counts, 12 ms. A drift over the probe (every later request slower) moves nothing: each revisit
    is held against the fresh count beside it. Every revisit quick: a cost with a memory of at least the
    probe's; none quick: no cost. The requests: distinct even counts, then each again beside itself + 1,
    token ids of each count, none of the counts to avoid."""
    def probe(d_ms, drift=0.0):
        """Fresh counts 40, 42, ... at 50 ms + 0.1 ms a token; revisit j quick by d_j; drift s a request."""
        m = len(d_ms)
        counts = [40 + 2 * i for i in range(m)]
        ttft = lambda n, i: 0.05 + 1e-4 * n + drift * i
        records = [record(i, i, ttft(n, i), 0.01, 1, prompt=n) for i, n in enumerate(counts)]
        for j, n in enumerate(counts[::-1]):
            i = m + 2 * j
            records += [record(i, i, ttft(n, i) - d_ms[j] / 1e3, 0.01, 1, prompt=n),
                        record(i + 1, i + 1, ttft(n + 1, i + 1), 0.01, 1, prompt=n + 1)]
        return records
    d = [12, 14, 11, 13, 1, -2, 0, 1]
    stepped = count_cost(probe(d))
    assert (stepped.new_count_s, stepped.memory, stepped.bounded) == (pytest.approx(0.012), 8, True)
    drifting = count_cost(probe(d, drift=0.002))
    assert (drifting.new_count_s, drifting.memory) == (pytest.approx(0.012), 8)
    rng = np.random.default_rng(0)
    kept = count_cost(probe(list(10 + rng.normal(0, 1, 24))))
    assert kept.new_count_s == pytest.approx(0.010, abs=0.001) and (kept.memory, kept.bounded) == (48, False)
    assert "keeps at least 48 counts" in kept.summary()
    assert count_cost(probe(list(rng.normal(0, 1, 24)))).new_count_s == 0
    assert count_cost(probe([12, 14, 1, 0])) is None                  # too few revisits
    assert count_cost(probe(d)[:-1]) is None                           # cut short by the budget
    requests = count_requests(20, seed=3, avoid={50, 51})
    counts = [r.prompt_tokens for r in requests]
    fresh, again = counts[:20], counts[20:]
    assert again[0::2] == fresh[::-1] and again[1::2] == [n + 1 for n in fresh[::-1]]
    assert len(set(counts)) == 40 and not {50, 51} & set(counts) and all(n % 2 == 0 for n in fresh)
    assert all(len(r.extra["prompt_token_ids"]) == r.prompt_tokens for r in requests)
    with pytest.raises(ConfigError, match="count-probes"):
        SweepDesign(count_probes=2)


def test_what_the_prefill_probes_paid_for_new_counts_by_hand():
    """counts.py `paid`'s worked example, memory 4: the probes' counts walked in order through the server's
    memory, each request its prompt's chunks."""
    cost = CountCost(0.01, 4, True, 20, 0.001)
    prompt = lambda n, error=None: record(0, 0, 0.1, 0.01, 1, prompt=n, error=error)
    assert paid([[prompt(16), prompt(16)], [prompt(16), prompt(32), prompt(16)]], cost, budget=None) == \
        [[0.01, 0.0], [0.0, 0.01, 0.0]]
    # five counts since 10 ran: forgotten, paid again; a failed request ran nothing
    assert paid([[prompt(n) for n in (10, 20, 30, 40, 50, 10)], [prompt(60, error="boom"), prompt(20)]], cost,
                budget=None) == [[0.01] * 6, [0.0, 0.01]]
    # a budget of 40: an 80-token prompt is two chunks of 40, one count; 100 is 40, 40, 20
    assert paid([[prompt(80), prompt(100)]], cost, budget=40) == [[0.01, 0.01]]


def record(index: int, send: float, ttft: float, gap: float, chunks: int, prompt: int = 100, **counters):
    times = [ttft + gap * i for i in range(chunks)]
    return RequestRecord(arm="off", method="http", load_kind="concurrency", load_value=4, category="chat",
                         request_id=f"r{index}", prompt_tokens=prompt, output_tokens=counters.pop("output", chunks),
                         send_time=send, ttft=ttft, e2e=times[-1], chunk_times=times,
                         chunk_tokens=counters.pop("chunk_tokens", []), **counters)


def test_a_wave_by_hand():
    """4 requests sent at 0, prefilled in one step (first tokens all at 0.1 s), then 40 ms steps: the
    window runs from the step after 0.1 s (the first of four decodes, left out) to the first finish;
    KV = 4 x (100 + the tokens made mid-window - 1), and each decode row attends to its cache and itself:
    attention pairs = KV + 4."""
    records = [record(i, 0.0, 0.1, 0.04, 30) for i in range(4)]
    steps = wave_steps(records, 4)
    assert steps.decode.seconds == pytest.approx(0.04)
    assert steps.decode.tokens == 4 and steps.window_steps == 28
    assert steps.decode.kv_tokens == pytest.approx(4 * (100 + (2 + 30) / 2 - 1))
    assert steps.decode.pairs == pytest.approx(4 * (100 + (2 + 30) / 2 - 1) + 4)
    # staggered prefill: the window starts a step after the last first token
    late = [record(i, 0.0, 0.1 + 0.04 * i, 0.04, 30) for i in range(4)]
    staggered = wave_steps(late, 4)
    assert staggered.window_steps == 25
    assert staggered.decode.seconds == pytest.approx(0.04)
    # a lost request breaks the lockstep: no sample
    assert wave_steps(records[:3], 4).decode is None


def test_a_speculating_wave_by_hand():
    """Each request drafted 3 tokens a step over 10 decode steps and accepted 10 of 30: 21 tokens in
    11 chunks (the first from the prefill), rows 1 + 30 / 10 = 4 a step. Mid-window (0.375 s: the window
    runs from the second chunk, at 0.15 s, to the last) each had made 12 tokens: 100 + 12 - 1 = 111
    cached, 4 x 111 + 4 x 5 / 2 = 454 attention pairs. From the server's counters instead (no
    per-request ones), each request's share of the wave's."""
    own = [record(i, 0.0, 0.1, 0.05, 11, output=21, drafts=10, draft_tokens=30, accepted_tokens=10)
           for i in range(2)]
    steps = wave_steps(own, 2)
    assert steps.decode.seconds == pytest.approx(0.05) and steps.decode.tokens == pytest.approx(8)
    assert steps.decode.kv_tokens == pytest.approx(2 * 111) and steps.decode.pairs == pytest.approx(2 * 454)
    shared = [record(i, 0.0, 0.1, 0.05, 11, output=21) for i in range(2)]
    assert wave_steps(shared, 2, drafts=(60, 20)).decode.tokens == pytest.approx(8)


def test_a_waves_admission_steps_by_hand():
    """admissions.py's worked example: budget 2,048, 64 prompts of 35 tokens, first tokens in groups of 1,
    58 and 5, two seconds and then 0.3 s apart, decodes of 50 ms. Step 2: 1 decode over 35 cached tokens,
    58 prompts whole and 17 tokens of the 59th: 2,048 tokens, 60 logits rows. Step 3: 59 decodes (the first
    over 36 cached tokens, the 58 over 35), the 18 tokens left of the 59th after its 17 and 4 prompts whole:
    217 tokens, 64 logits rows. Groups the rule does not make (57 and 6: a request that came late), or a
    first group that may have ended in a chunk (a budget of 50), give none; a step under four decodes'
    time is not kept."""
    def wave(sizes, gaps):
        times, start = [], 0.2
        for size, gap in zip(sizes, [0.0, *gaps]):
            start += gap
            times += [start + 0.001 * i for i in range(size)]      # the client reads a group's streams in turn
        return [record(i, 0.0, t, 0.05, 10, prompt=35) for i, t in enumerate(times)]
    one_row = [(1.0, 1.0)] * 64
    step2, step3 = admission_steps(wave([1, 58, 5], [2.0, 0.3]), 0.05, 2048, one_row)
    assert step2.seconds == pytest.approx(2.0) and step3.seconds == pytest.approx(0.3)
    assert step2.shape == StepShape.of([1] + [35] * 58 + [17], [35] + [0] * 59)
    assert (step2.tokens, step2.kv_tokens, step2.logits_rows) == (2048, 35, 60)
    assert step3.shape == StepShape.of([1] * 59 + [18] + [35] * 4, [36] + [35] * 58 + [17] + [0] * 4)
    assert (step3.tokens, step3.logits_rows) == (217, 64)
    assert admission_steps(wave([1, 57, 6], [2.0, 0.3]), 0.05, 2048, one_row) == []
    assert admission_steps(wave([1, 58, 5], [2.0, 0.3]), 0.05, 50, one_row) == []
    assert len(admission_steps(wave([1, 58, 5], [2.0, 0.3]), 0.1, 2048, one_row)) == 1     # 0.3 s < 4 x 0.1


def test_a_prefill_is_the_median_ttft_of_single_requests():
    records = [record(i, i, ttft, 0.04, 2, prompt=256) for i, ttft in enumerate((0.31, 0.30, 0.45))]
    assert prefill_sample(records) == StepSample(StepShape(256, 0, 256 * 257 / 2), pytest.approx(0.31), logits_rows=1,
                                                 first_token=True)


def test_a_prompt_longer_than_the_token_budget_is_its_chunks_steps():
    """1,064 tokens at a budget of 512: chunks of 512, 512 and 40 over 0, 512 and 1,024 cached tokens,
    three steps; within the budget, one step as before."""
    records = [record(i, i, ttft, 0.04, 2, prompt=1064) for i, ttft in enumerate((0.78, 0.79, 0.80))]
    sample = prefill_sample(records, max_num_batched_tokens=512)
    pairs = 512 * 513 / 2 + (512 * 512 + 512 * 513 / 2) + (40 * 1024 + 40 * 41 / 2)
    assert sample == StepSample(StepShape(1064, 512 + 1024, pairs), pytest.approx(0.79), logits_rows=1,
                                first_token=True, steps=3)
    assert prefill_sample(records, max_num_batched_tokens=2048) == prefill_sample(records)
    assert prompt_chunks(1024, 512) == ([512, 512], [0, 512]) and prompt_chunks(100, None) == ([100], [0])
    with pytest.raises(ConfigError, match="max-num-batched-tokens"):
        SweepDesign(max_num_batched_tokens=0)


def test_merged_chunks_count_their_tokens():
    """A plain server that fell behind sent two steps' tokens in one chunk: steps are counted as tokens."""
    records = [record(i, 0.0, 0.1, 0.08, 15, output=29, chunk_tokens=[1] + [2] * 14) for i in range(2)]
    assert wave_steps(records, 2).decode.seconds == pytest.approx(0.04)


def test_attention_pairs_are_fitted_where_the_server_prefilled_every_probe_whole():
    """calibrate --endpoint's default: pairs fitted for a server that ran each probe in one step (vLLM at its
    budget of 2,048), not for one that ran the longest in chunks (ours at 512); a flag given stands."""
    def probes(budget):
        return [Probe("off", n, [], prefill_sample_of(n, budget)) for n in (32, 256, 1024)]
    assert with_pairs_decided(FitOptions(), probes(2048)).fit_attention_pairs is True
    assert with_pairs_decided(FitOptions(), probes(512)).fit_attention_pairs is False
    assert with_pairs_decided(FitOptions(fit_attention_pairs=False), probes(2048)).fit_attention_pairs is False
    assert with_pairs_decided(FitOptions(fit_attention_pairs=True), probes(512)).fit_attention_pairs is True


def prefill_sample_of(prompt: int, budget: int) -> StepSample:
    record = RequestRecord(arm="off", method="off", load_kind="concurrency", load_value=1, category="chat",
                           request_id="prefill-p1-0", prompt_tokens=prompt, output_tokens=1, send_time=0.0, ttft=0.1)
    return prefill_sample([record], budget)
