"""How a server reads its KV cache (engine/cost/kv_reads.py): the docstring's worked example, the padding and
groups equal to what our model runner's attention groups read (the runner's own `prepare`, not a copy of
its rule), a step's features with the reads, the fit recovering a group's cost, and the simulator costing
a step as the server reads it."""

import numpy as np
import pytest
import torch

from specwise.bench.inputs.request import WorkloadRequest
from specwise.bench.load.arrivals import LoadPoint
from specwise.calc.arms import OFF
from specwise.engine.cost.kv_reads import KVReads
from specwise.engine.cost.linear_cost import LinearStepCost, StepShape
from specwise.engine.cost.step_fit import StepSample, fit
from specwise.engine.model_runner import ModelRunner
from specwise.errors import ConfigError
from specwise.models.attention import GROUP_SIZE
from specwise.models.llama import LlamaForCausalLM
from specwise.sim.flat import FlatSimulator
from specwise.sim.simulator import SimServerConfig
from tiny_models import tiny_checkpoint


def test_the_worked_example():
    """Groups of 2, blocks of 16, decodes over 10, 50, 20 and 30 cached tokens: groups (11, 21) and (31, 51)
    read 32 and 64 tokens a member, padding 78, KV tokens read 188."""
    reads = KVReads(2, 16)
    assert reads.padding([1, 1, 1, 1], [10, 50, 20, 30]) == 78
    assert reads.groups([1, 1, 1, 1], [10, 50, 20, 30]) == 2
    shape = StepShape.of([1, 1, 1, 1], [10, 50, 20, 30], reads)
    assert (shape.tokens, shape.kv_tokens, shape.groups) == (4, 188, 2)
    assert StepShape.of([1, 1, 1, 1], [10, 50, 20, 30]) == StepShape(4, 110, 114)      # no reads: its own tokens
    # a prompt chunk from position 0 reads no cache; sequences fed different row counts group apart
    assert reads.groups([30, 1, 5], [0, 10, 10]) == 2 and reads.padding([30, 1, 5], [0, 10, 10]) == (16 - 11) + (16 - 15)
    with pytest.raises(ValueError, match="one step"):
        StepShape.of([[1], [1]], [[10], [20]], reads)


def test_the_grammar_and_the_profile_form():
    assert KVReads.parse("16/16") == KVReads(16, 16) and KVReads.parse("none") is None
    assert KVReads.parse(KVReads(8, 32).text()) == KVReads(8, 32)
    assert KVReads.from_json(KVReads(8, 32).to_json()) == KVReads(8, 32)
    assert KVReads.from_json(None) is None and KVReads.from_json({"group_size": "16", "block_size": 16}) is None
    for bad in ("16", "16/x", "0/16"):
        with pytest.raises(ConfigError, match="16/16|at least 1"):
            KVReads.parse(bad)


def test_what_kv_reads_counts_is_what_the_runners_groups_read():
    """A step of 21 decodes over contexts 3-60, 3 verifications of 1 + 2 rows, a prompt chunk from 0 and a
    later chunk of 5: the groups `ModelRunner.prepare` builds read, past each member's own context, what
    the runner's `kv_reads` says, in as many groups."""
    block_size = 4
    model = LlamaForCausalLM(tiny_checkpoint().config, max_positions=128).eval()
    runner = ModelRunner(model, num_blocks=512, block_size=block_size, dtype=torch.float32)
    rng = np.random.default_rng(0)
    cached = [int(c) for c in rng.integers(2, 60, 21)] + [7, 40, 19] + [0, 12]
    fed = [1] * 21 + [3] * 3 + [9, 5]
    tables, next_block = [], 0
    for c, n in zip(cached, fed):
        blocks = -(-(c + n) // block_size)
        tables.append(list(range(next_block, next_block + blocks)))
        next_block += blocks
    _, _, metadata = runner.prepare([[1] * n for n in fed], cached, tables)
    read = sum(group.block_tables.numel() * block_size for group in metadata.groups)
    own = sum(c + n for c, n in zip(cached, fed) if c > 0)
    assert runner.kv_reads == KVReads(GROUP_SIZE, block_size)
    assert read - own == runner.kv_reads.padding(fed, cached) > 0
    assert len(metadata.groups) == runner.kv_reads.groups(fed, cached) == 4     # 16 + 5 decodes, 3 verifying, 1 chunk


def test_the_fit_recovers_what_a_group_costs():
    """A server like ours (20 ms + 1.4 ms a token + 3 us a KV token read + 10 ms a group, a request 5 ms),
    calibrate's waves at batch 1, 4, 16, 64 (contexts within a wave differ: prompts cut by characters) and
    prefills of 32, 256 and 1,024 tokens in chunks of 512 (+-0.1%): every coefficient comes back within 2%."""
    reads = KVReads(16, 16)
    truth = LinearStepCost(0.020, 0.0014, 3e-6, request_overhead_s=0.005, per_attention_group_s=0.010,
                           kv_reads=reads)
    rng = np.random.default_rng(1)
    samples = []
    for batch in (1, 4, 16, 64):
        for prompt in (32, 256):
            shape = StepShape.of(np.ones(batch), prompt + 24 + rng.integers(-20, 20, batch), reads)
            samples.append(StepSample(shape, float(truth.seconds(shape))))
    for prompt in (32, 256, 1024):
        chunks = [StepShape.of([n], [start], reads) for start, n in zip(range(0, prompt, 512),
                                                                         [min(512, prompt - s) for s in range(0, prompt, 512)])]
        shape = StepShape(*(sum(getattr(c, name) for c in chunks) for name in ("tokens", "kv_tokens", "pairs", "groups")))
        seconds = float(sum(truth.seconds(c, 1) for c in chunks)) + truth.request_overhead_s
        samples.append(StepSample(shape, seconds * (1 + rng.uniform(-1e-3, 1e-3)), logits_rows=1, first_token=True,
                                  steps=len(chunks)))
    cost = fit(samples, None, reads).cost
    fitted, known = cost.to_json(), truth.to_json()
    assert fitted.pop("kv_reads") == known.pop("kv_reads") == {"group_size": 16, "block_size": 16}
    assert fitted == pytest.approx(known, rel=0.02, abs=1e-7)
    assert cost.kv_reads == reads and "10.00 ms/attention group" in cost.description
    assert LinearStepCost.from_json(cost.to_json()).to_json() == cost.to_json()
    # the calculators' steps (every sequence alike): a batch's groups, none over no cache
    assert cost.step_times(17, 1, np.array([0.0, 17 * 100])) == pytest.approx(
        [0.020 + 0.0014 * 17, 0.020 + 0.0014 * 17 + 3e-6 * 1700 + 2 * 0.010], rel=0.02)


def test_the_simulator_costs_a_step_as_the_server_reads_it():
    """10 ms a step + 0.1 ms a KV token read + 5 ms a group, groups of 16 in blocks of 16, requests a
    (8-token prompt) and b (40) sent together, 3 tokens each. An idle engine prefills a alone (no cache
    read: 10 ms); then a's decode over context 9, read to 16 (8 cached + 7 padding: 10 + 1.5 + 5 =
    16.5 ms), beside b's prompt (no cache read); then both decode over contexts 10 and 41, read to 48
    tokens as one group (49 cached + 45 padding = 94: 10 + 9.4 + 5 = 24.4 ms); then b alone over 42,
    read to 48 (41 + 6: 19.7 ms). Without the reads, each its own cached tokens (8, 49, 41) and no
    group: 10.8, 14.9 and 14.1 ms."""
    requests = [WorkloadRequest(request_id=name, category="chat", max_tokens=3, prompt_tokens=prompt)
                for name, prompt in (("a", 8), ("b", 40))]
    grouped = LinearStepCost(0.010, 0.0, 1e-4, per_attention_group_s=0.005, kv_reads=KVReads(16, 16))
    records = FlatSimulator(grouped, SimServerConfig(), 10_000).run(requests, OFF, LoadPoint("concurrency", 2)).records
    assert [r.chunk_times for r in records] == [pytest.approx([0.010, 0.0265, 0.0509]),
                                                pytest.approx([0.0265, 0.0509, 0.0706])]
    own = LinearStepCost(0.010, 0.0, 1e-4, per_attention_group_s=0.005)
    records = FlatSimulator(own, SimServerConfig(), 10_000).run(requests, OFF, LoadPoint("concurrency", 2)).records
    assert [r.chunk_times for r in records] == [pytest.approx([0.010, 0.0208, 0.0357]),
                                                pytest.approx([0.0208, 0.0357, 0.0498])]
