"""Turn logits into the distribution we sample from, and sample it per request.

The same `logits_to_probs` is applied to target and draft logits, so the verifier
compares like with like (temperature, top-k, top-p on both sides). Greedy rows
(temperature 0) become one-hot at the argmax: the general acceptance rule then
reduces to "accept while the draft equals the argmax".

Every tensor lives on the runner's device; which filters a batch needs is decided on
the host (`SamplingTensors`), so building the distribution never waits on the device.
"""

from dataclasses import dataclass

import torch

from specwise.sampling_params import SamplingParams


@dataclass
class SamplingTensors:
    """Per-row settings of one batch of logits rows, on the device they are applied on."""

    temperatures: torch.Tensor      # [num_rows] fp32; 0 = greedy
    top_ks: torch.Tensor            # [num_rows] long; 0 = off
    top_ps: torch.Tensor            # [num_rows] fp32; 1 = off
    any_greedy: bool
    any_top_k: bool
    any_top_p: bool

    @classmethod
    def build(cls, temperatures: list[float], top_ks: list[int], top_ps: list[float],
              device: torch.device | str = "cpu") -> "SamplingTensors":
        return cls(torch.tensor(temperatures, dtype=torch.float32, device=device),
                   torch.tensor(top_ks, dtype=torch.long, device=device),
                   torch.tensor(top_ps, dtype=torch.float32, device=device),
                   any_greedy=any(t == 0 for t in temperatures), any_top_k=any(k > 0 for k in top_ks),
                   any_top_p=any(p < 1 for p in top_ps))

    @classmethod
    def from_params(cls, params: list[SamplingParams], rows_per_seq: int,
                    device: torch.device | str = "cpu") -> "SamplingTensors":
        """`rows_per_seq` consecutive rows per request (its verified positions)."""
        repeat = lambda values: [value for value in values for _ in range(rows_per_seq)]   # noqa: E731
        return cls.build(repeat([p.temperature for p in params]), repeat([p.top_k for p in params]),
                         repeat([p.top_p for p in params]), device)


def logits_to_probs(logits: torch.Tensor, sampling: SamplingTensors) -> torch.Tensor:
    """logits [num_rows, vocab_size] -> probs [num_rows, vocab_size] fp32."""
    logits = logits.float()
    greedy = sampling.temperatures == 0
    safe_temperatures = torch.where(greedy, torch.ones_like(sampling.temperatures), sampling.temperatures)
    scaled = logits / safe_temperatures.unsqueeze(1)
    if sampling.any_top_k:
        scaled = _apply_top_k(scaled, sampling.top_ks)
    if sampling.any_top_p:
        scaled = _apply_top_p(scaled, sampling.top_ps)
    probs = torch.softmax(scaled, dim=-1)
    if sampling.any_greedy:
        one_hot = torch.zeros_like(probs)
        one_hot.scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy.unsqueeze(1), one_hot, probs)
    return probs


def _apply_top_k(logits: torch.Tensor, top_ks: torch.Tensor) -> torch.Tensor:
    vocab_size = logits.shape[-1]
    k = torch.where(top_ks > 0, top_ks.clamp(max=vocab_size), torch.full_like(top_ks, vocab_size))
    # kth largest value per row: keep everything >= it (ties at the boundary are all kept)
    sorted_logits = logits.sort(dim=-1, descending=True).values      # [num_rows, vocab_size]
    kth = sorted_logits.gather(1, (k - 1).unsqueeze(1))               # [num_rows, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def _apply_top_p(logits: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)      # [num_rows, vocab_size]
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_ps.unsqueeze(1)
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample(probs: torch.Tensor, greedy: list[bool], generators: list[torch.Generator]) -> list[int]:
    """One token per row; each row draws from its own request's generator (batch-invariant).
    Generators live on the device of `probs`."""
    argmax = probs.argmax(dim=-1).tolist()
    return [argmax[row] if greedy[row] else
            int(torch.multinomial(probs[row], 1, generator=generators[row]))
            for row in range(probs.shape[0])]


def request_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A request's own random stream, on the device its probabilities live on."""
    return torch.Generator(device=device).manual_seed(seed)
