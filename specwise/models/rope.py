"""Rotary position embeddings (HF "rotate half" layout), with Llama 3 and linear scaling."""

import math

import torch
import torch.nn.functional as F


def inverse_frequencies(head_dim: int, rope_theta: float, rope_scaling: dict | None) -> torch.Tensor:
    """[head_dim // 2] fp64 inverse frequencies, scaled as the checkpoint asks."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    inv_freq = 1.0 / (rope_theta ** exponents)
    kind = (rope_scaling or {}).get("rope_type") or (rope_scaling or {}).get("type")
    if kind in (None, "default"):
        return inv_freq
    if kind == "linear":
        return inv_freq / rope_scaling["factor"]
    if kind == "llama3":
        return _llama3_scaling(inv_freq, rope_scaling)
    raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: linear, llama3)")


def _llama3_scaling(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Long wavelengths are divided by `factor`, short ones kept, the band between blended."""
    factor = scaling["factor"]
    low_freq_factor = scaling.get("low_freq_factor", 1.0)
    high_freq_factor = scaling.get("high_freq_factor", 4.0)
    original_len = scaling.get("original_max_position_embeddings", 8192)
    wavelength = 2 * math.pi / inv_freq
    low_freq_wavelength = original_len / low_freq_factor
    high_freq_wavelength = original_len / high_freq_factor
    smooth = (original_len / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelength > low_freq_wavelength, inv_freq / factor, inv_freq)
    is_band = (wavelength >= high_freq_wavelength) & (wavelength <= low_freq_wavelength)
    return torch.where(is_band, blended, scaled)


class RotaryEmbedding(torch.nn.Module):
    def __init__(self, head_dim: int, max_positions: int, rope_theta: float, rope_scaling: dict | None):
        super().__init__()
        inv_freq = inverse_frequencies(head_dim, rope_theta, rope_scaling)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
        # sin carries rotate-half's sign: rotate_half(x) * sin == x.roll(head_dim // 2) * [-sin, sin] (see apply_rotary)
        self.register_buffer("cos", torch.cat([angles, angles], dim=-1).cos().float(), persistent=False)
        self.register_buffer("sin", torch.cat([-angles, angles], dim=-1).sin().float(), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [num_tokens] -> cos, signed sin [num_tokens, 1, head_dim], once per forward."""
        cos = F.embedding(positions, self.cos).unsqueeze(-2).to(dtype)
        sin = F.embedding(positions, self.sin).unsqueeze(-2).to(dtype)
        return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [num_tokens, heads, head_dim] rotated by its positions' angles (cos, signed sin [num_tokens, 1, head_dim]
    from RotaryEmbedding). HF's x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]: rolling x by half
    gives [x2, x1] and the sign sits in sin, one op fewer and the same numbers (negation is exact)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin
