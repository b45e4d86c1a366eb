"""Turn logits into the distribution we sample from, and sample it per request.

The same `logits_to_probs` is applied to target and draft logits, so the verifier
compares like with like (temperature, top-k, top-p on both sides). Greedy rows
(temperature 0) become one-hot at the argmax: the general acceptance rule then
reduces to "accept while the draft equals the argmax".
"""

import torch


def logits_to_probs(logits: torch.Tensor, temperatures: torch.Tensor, top_ks: torch.Tensor,
                    top_ps: torch.Tensor) -> torch.Tensor:
    """logits [num_rows, vocab_size]; per-row settings [num_rows] -> probs [num_rows, vocab_size] fp32."""
    logits = logits.float()
    greedy = temperatures == 0
    safe_temperatures = torch.where(greedy, torch.ones_like(temperatures), temperatures)
    scaled = logits / safe_temperatures.unsqueeze(1)
    if bool((top_ks > 0).any()):
        scaled = _apply_top_k(scaled, top_ks)
    if bool((top_ps < 1).any()):
        scaled = _apply_top_p(scaled, top_ps)
    probs = torch.softmax(scaled, dim=-1)
    if bool(greedy.any()):
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
    """One token per row; each row draws from its own request's generator (batch-invariant)."""
    argmax = probs.argmax(dim=-1).tolist()
    return [argmax[row] if greedy[row] else
            int(torch.multinomial(probs[row], 1, generator=generators[row]))
            for row in range(probs.shape[0])]
