"""Latency of one batch of identical requests: time to first token, time per output token, end to end.

TTFT = one prefill step over every prompt of the batch (it runs before any decode step);
TPOT = the mean of the output_tokens - 1 decode steps, each over a context one token
longer than the last; e2e = TTFT + all decode steps. The memory check says whether the
weights and this batch's KV cache fit, and how many tokens of KV cache remain.

Worked example (Llama-3.1-8B, bf16, one H100 SXM, 0.8 of peak bandwidth, batch 1,
1,024 prompt + 256 output tokens): every decode step reads 15.0 GB of weights plus
up to 0.17 GB of KV at 2.68 TB/s, about 5.7 ms, so TPOT ~ 5.7 ms and e2e ~ 1.5 s.
"""

from dataclasses import dataclass, field

import numpy as np

from specwise.calc.deployment import Deployment, MemoryPlan
from specwise.engine.cost.step_cost import StepCostModel
from specwise.errors import ConfigError


@dataclass
class LatencyConfig:
    prompt_tokens: int = field(default=1024, metadata={"help": "prompt length, tokens"})
    output_tokens: int = field(default=256, metadata={"help": "output length, tokens"})
    batch_size: int = field(default=1, metadata={"help": "requests decoded together"})

    def __post_init__(self):
        for name in ("prompt_tokens", "output_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class LatencyResult:
    ttft_s: float
    tpot_s: float
    e2e_s: float
    prefill_bound: str | None         # "memory" / "compute" under the roofline; None for a profile
    decode_bound: str | None
    memory: MemoryPlan
    kv_tokens_needed: int

    @property
    def fits(self) -> bool:
        return self.memory.fits and self.kv_tokens_needed <= self.memory.kv_capacity_tokens

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of one sequence during decode."""
        return 1.0 / self.tpot_s if self.tpot_s else float("inf")


def estimate_latency(cost: StepCostModel, deployment: Deployment, config: LatencyConfig) -> LatencyResult:
    prompt, output, batch = config.prompt_tokens, config.output_tokens, config.batch_size
    ttft = cost.prefill_time([prompt] * batch)
    # decode step j runs over prompt + j cached tokens per sequence (the first token came from prefill)
    steps = cost.step_times(batch, 1, batch * (prompt + np.arange(output - 1, dtype=float)))
    tpot = float(steps.mean()) if len(steps) else 0.0
    bound = getattr(cost, "bound", None)
    return LatencyResult(ttft_s=ttft, tpot_s=tpot, e2e_s=ttft + float(steps.sum()),
                         prefill_bound=bound(batch, prompt, 0) if bound else None,
                         decode_bound=bound(batch, 1, prompt + output / 2) if bound else None,
                         memory=deployment.memory_plan(), kv_tokens_needed=batch * (prompt + output))
