"""Discrete-event simulation of one continuous-batching server, on paper: the V0 model
(`--scheduler v0`; the default, today's flat step, is sim/flat.py).

The server is modelled like vLLM's V0 scheduler, the one its speculative decoding ran on:
  - waiting requests are admitted first come, first served, as a prefill step of whole
    prompts (at most max_num_seqs running, max_num_batched_tokens per prefill, and free
    KV blocks for the prompt plus the step's lookahead, keeping a small watermark free);
  - otherwise every running sequence takes one decode step: k drafts (k from the arm's
    batch-size policy) and one verification pass over 1 + k tokens, emitting 1 + accepted;
  - KV blocks are allocated as sequences grow; when a step would not fit, the newest
    sequence is preempted (its blocks freed, recomputed later from prompt + output);
  - every request generates exactly max_tokens (traces give the length; EOS is not modelled);
  - a drafter that proposes nothing at some steps (n-gram lookup without a match) has those
    sequences verify 1 token; the step's time is interpolated by the share that drafted.

Speed: between two events (an arrival that could be admitted, a finish, a KV shortfall)
the batch is fixed, so a whole run of decode steps is drawn and costed at once with
numpy ([batch, steps] matrices). Acceptance draws come from one uniform stream per
request (u < p_i accepts draft i), so the records can be rebuilt exactly afterwards.
"""

from dataclasses import dataclass, field

import numpy as np

from specwise.bench.inputs.request import WorkloadRequest
from specwise.bench.load.arrivals import LoadPoint
from specwise.calc.arms import SpecArm
from specwise.engine.cost.step_cost import StepCostModel
from specwise.errors import ConfigError
from specwise.sim.state import SimState

SCHEDULERS = ("flat", "v0")


@dataclass
class SimServerConfig:
    """The simulated server's scheduler and KV cache (`specwise simulate` flags; not server/config.py)."""
    max_num_seqs: int = field(default=256, metadata={"help": "most sequences running at once"})
    max_num_batched_tokens: int = field(default=8192, metadata={"help": "most prompt tokens in one prefill step"})
    block_size: int = field(default=16, metadata={"help": "tokens per KV-cache block"})
    kv_cache_tokens: int | None = field(default=None, metadata={
        "help": "KV cache size in tokens (default: GPU memory left after weights)"})
    watermark: float = field(default=0.01, metadata={"help": "fraction of KV blocks kept free at admission (v0)"})
    scheduler: str = field(default="flat", metadata={
        "help": "flat: today's engines (ours, vLLM V1): decodes with their drafts, then prompt chunks, in one "
                "step (sim/flat.py); v0: vLLM V0, prefill steps of whole prompts apart from decode steps"})

    def __post_init__(self):
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < self.block_size:
            raise ConfigError(f"kv_cache_tokens must hold at least one block, got {self.kv_cache_tokens}")
        if self.scheduler not in SCHEDULERS:
            raise ConfigError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got {self.scheduler!r}")
        if not 0 <= self.watermark < 1:
            raise ConfigError(f"watermark must be in [0, 1), got {self.watermark}")


@dataclass
class SimResult:
    arm: str
    load: LoadPoint
    state: SimState
    duration: float                # first send to last finish, seconds
    occupancy: float               # integral of requests in the system (waiting + running) over time
    peak_kv_blocks: int            # most KV blocks any step held (lookahead slots included)
    kv_blocks: int
    preemptions: int
    decode_steps: int
    prefill_steps: int


class Simulator:
    def __init__(self, cost: StepCostModel, server: SimServerConfig, kv_capacity_tokens: int, seed: int = 0):
        if kv_capacity_tokens < server.block_size:
            raise ConfigError(f"the KV cache holds {kv_capacity_tokens} tokens: the model does not fit")
        self.cost, self.server, self.seed = cost, server, seed
        self.kv_blocks = kv_capacity_tokens // server.block_size

    def run(self, requests: list[WorkloadRequest], arm: SpecArm, load: LoadPoint,
            burstiness: float = 1.0, duration: float | None = None) -> SimResult:
        state = SimState(self, requests, arm, load, burstiness, duration)
        state.simulate()
        return SimResult(arm=arm.name, load=load, state=state, duration=_duration(state),
                         occupancy=state.occupancy, peak_kv_blocks=state.peak_blocks, kv_blocks=self.kv_blocks,
                         preemptions=state.preemptions, decode_steps=state.decode_steps,
                         prefill_steps=state.prefill_steps)


def _duration(state: SimState) -> float:
    """First send to last finish."""
    done = ~np.isnan(state.finish)
    if not done.any():
        return 0.0
    return float(state.finish[done].max() - np.nanmin(state.send[done]))
