"""Roofline step costs from catalog figures.

One forward pass takes max(bytes / bandwidth, flops / peak) + all-reduces + a fixed overhead:
  bytes  = weights read once per step + KV cache read (context) and written (new tokens)
  flops  = 2 x weights x new tokens + 4 x layers x heads x head_dim x (query, key) pairs
  bandwidth and peak are the spec-sheet figures of all `tp` GPUs times the efficiency factors.

Worked example (Llama-3.1-8B, bf16, one H100 SXM, efficiency 1, batch 1, 1,000 cached tokens):
  weights read = (8.03e9 - 128256 x 4096 input embedding) x 2 B = 15.01 GB
  KV read      = 1,000 x 131,072 B = 0.13 GB
  time         = 15.14 GB / 3,350 GB/s = 4.52 ms, far above the 16 GFLOP / 989.5 TFLOP/s = 0.02 ms
so decode is memory-bound: about 221 tokens/s at best.
"""

import numpy as np

from specwise.calc.deployment import WEIGHT_BYTES, Deployment
from specwise.engine.cost.step_cost import StepCostModel, attention_pairs, check_step_shape

ACTIVATION_BYTES = 2          # bf16 activations cross the tensor-parallel all-reduces


class RooflineCost(StepCostModel):
    def __init__(self, deployment: Deployment):
        d, m = deployment, deployment.model
        self.deployment = deployment
        self.bandwidth = d.tp * d.gpu.bandwidth_gbs * 1e9 * d.mem_efficiency
        self.flops = d.tp * d.peak_flops_per_gpu * d.compute_efficiency
        self.weight_bytes = m.streamed_parameters * WEIGHT_BYTES[d.weight_dtype]
        self.kv_per_token = d.kv_bytes_per_token
        self.linear_flops_per_token = 2.0 * m.streamed_parameters
        self.attention_flops_per_pair = 4.0 * m.num_layers * m.num_heads * m.head_dim
        self.allreduces = 2 * m.num_layers if d.tp > 1 else 0
        self.allreduce_bytes_per_token = m.hidden_size * ACTIVATION_BYTES * 2 * (d.tp - 1) / d.tp
        self.link = d.gpu.interconnect_gbs * 1e9 / 2
        self.overhead = d.forward_overhead_s
        self.allreduce_latency = d.allreduce_latency_s
        self.description = f"roofline: {d.label()}"
        self._lines: dict[tuple[int, int], tuple] = {}

    def _fixed(self, new_tokens: float) -> float:
        """All-reduces and the per-pass overhead: independent of the context."""
        comm = self.allreduces * (self.allreduce_latency + new_tokens * self.allreduce_bytes_per_token / self.link)
        return comm + self.overhead

    def lines(self, batch_size: int, tokens_per_seq: int) -> tuple[float, float, float, float, float]:
        """Memory time m0 + m1 x C and compute time c0 + c1 x C of a step over C cached tokens
        (summed over the batch), and its fixed part: (m0, m1, c0, c1, fixed)."""
        key = (batch_size, tokens_per_seq)
        if key not in self._lines:
            new = batch_size * tokens_per_seq
            # each new token attends to the cached context (c1 below: t pairs a cached token) and,
            # causally, to the new tokens before it
            own_pairs = batch_size * float(attention_pairs(tokens_per_seq, 0))
            self._lines[key] = (
                (self.weight_bytes + new * self.kv_per_token) / self.bandwidth,
                self.kv_per_token / self.bandwidth,
                (self.linear_flops_per_token * new + self.attention_flops_per_pair * own_pairs) / self.flops,
                self.attention_flops_per_pair * tokens_per_seq / self.flops,
                self._fixed(new))
        return self._lines[key]

    def step_times(self, batch_size: int, tokens_per_seq: int, total_context) -> np.ndarray:
        check_step_shape(batch_size, tokens_per_seq)
        m0, m1, c0, c1, fixed = self.lines(batch_size, tokens_per_seq)
        context = np.asarray(total_context, dtype=float)
        return np.maximum(m0 + m1 * context, c0 + c1 * context) + fixed

    def prefill_time(self, prompt_lens) -> float:
        new = float(sum(prompt_lens))
        pairs = float(np.sum(attention_pairs(prompt_lens, 0)))
        memory = (self.weight_bytes + new * self.kv_per_token) / self.bandwidth
        compute = (self.linear_flops_per_token * new + self.attention_flops_per_pair * pairs) / self.flops
        return max(memory, compute) + self._fixed(new)

    def bound(self, batch_size: int, tokens_per_seq: int, context_len: float) -> str:
        """'memory' or 'compute': which side of the roofline this step sits on."""
        m0, m1, c0, c1, _ = self.lines(batch_size, tokens_per_seq)
        total = batch_size * context_len
        return "memory" if m0 + m1 * total >= c0 + c1 * total else "compute"
