"""Weight formats for CPU decoding: fewer bytes per step through well-kept PyTorch kernels.

Decoding a few sequences reads every weight once per step, so a step costs about
weight bytes / memory bandwidth. Each format swaps the model's Linear layers for one of:

  bf16     oneDNN with the weight reordered once into its blocked layout
           (torch.ops.mkldnn._reorder_linear_weight / _linear_pointwise): 2 bytes a weight
  int8     per-output-channel symmetric int8 (torch.ops.aten._weight_int8pack_mm): 1 byte
  int4     groups of 32 along the input, asymmetric, tinygemm layout
           (torch.ops.aten._weight_int4pack_mm_for_cpu): half a byte plus a scale and zero per group;
           the LM head stays int8 (int4 there moved the top-1 token on 15% of positions, int8 on 3%)

int8 and int4 run with bfloat16 activations: with fp32 activations these kernels fall back
to scalar code, 3-100x slower than fp32 matmuls (measured on an AVX-512 CPU, torch 2.13).

Worked example (int4, one group of 4 for brevity): weights [0.1, 0.5, -0.3, 0.2] ->
min -0.3, max 0.5, scale = 0.8 / 15 = 0.0533, zero = min + 8 * scale = 0.1267;
q = round((w - min) / scale) = [7, 15, 0, 9]; dequantized (q - 8) * scale + zero =
[0.073, 0.5, -0.3, 0.18]: every weight within scale / 2 of the original.
A GGUF checkpoint stored as Q4_0/Q4_1 (groups of 32) requantizes to int4 almost exactly.
"""

import torch
from torch import nn

from specwise.config import QUANTIZATIONS
from specwise.errors import ConfigError

INT4_GROUP_SIZE = 32


class OneDNNLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.weight_bytes = weight.numel() * 2                             # the packed copy is not a buffer
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16).contiguous(), 1)
        self.bias = None if bias is None else bias.to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [..., in_features] -> [..., out_features]: the kernel folds the leading dims itself
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


class Int8Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        weight = weight.float()
        scales = (weight.abs().amax(dim=1) / 127).clamp(min=1e-8)           # [out_features]
        self.register_buffer("weight_int8", torch.round(weight / scales[:, None]).clamp(-127, 127)
                             .to(torch.int8).contiguous())                   # [out_features, in_features]
        self.register_buffer("scales", scales.to(torch.bfloat16))           # in the activations' dtype
        self.bias = None if bias is None else bias.to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).contiguous()                      # the kernel needs contiguous rows
        out = torch.ops.aten._weight_int8pack_mm(flat, self.weight_int8, self.scales)
        out = out if self.bias is None else out + self.bias
        return out.view(*x.shape[:-1], -1)


class Int4Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group_size: int = INT4_GROUP_SIZE):
        super().__init__()
        out_features, in_features = weight.shape
        if in_features % group_size:
            raise ConfigError(f"int4 needs input sizes divisible by {group_size}, got {in_features}")
        groups = weight.float().view(out_features, in_features // group_size, group_size)
        low, high = groups.amin(dim=-1, keepdim=True), groups.amax(dim=-1, keepdim=True)
        scale = ((high - low) / 15).clamp(min=1e-8)                          # [out, groups, 1]
        zero = low + 8 * scale                                               # dequantized: (q - 8) * scale + zero
        q = torch.round((groups - low) / scale).clamp(0, 15).to(torch.int32).view(out_features, in_features)
        self.register_buffer("weight_int4", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
        scales_and_zeros = torch.stack([scale.squeeze(-1), zero.squeeze(-1)], dim=-1)   # [out, groups, 2]
        self.register_buffer("scales_and_zeros", scales_and_zeros.transpose(0, 1).contiguous().to(torch.bfloat16))
        self.group_size = group_size
        self.bias = None if bias is None else bias.to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).contiguous()                      # the kernel needs contiguous rows
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.weight_int4, self.group_size,
                                                          self.scales_and_zeros)
        out = out if self.bias is None else out + self.bias
        return out.view(*x.shape[:-1], -1)


def compute_dtype(name: str, device: str) -> torch.dtype:
    """`auto`: bfloat16 where the hardware computes it natively (CPU flags avx512_bf16 or amx_bf16,
    or a GPU that supports it), else float32; any other name is taken as it is."""
    if name != "auto":
        return getattr(torch, name)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if device == "cpu" and _cpu_has_native_bf16() else torch.float32


def _cpu_has_native_bf16() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as stream:
            flags = next((line for line in stream if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def pack_weights(model: nn.Module, dtype: torch.dtype, quantization: str, device: str,
                 compiled: bool = False) -> nn.Module:
    """Swap the Linear layers of a loaded model for the kernels of its weight format (CPU only;
    fp32 and other devices keep plain nn.Linear). `compiled`: bf16 layers stay plain, LM head included, for
    inductor to pack (models/compiled.py compiles the forward and the LM head)."""
    if quantization not in QUANTIZATIONS:
        raise ConfigError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    if quantization != "none" and dtype != torch.bfloat16:
        raise ConfigError(f"{quantization} weights run with bfloat16 activations on CPU: use --dtype bfloat16")
    if device != "cpu" or (dtype != torch.bfloat16 and quantization == "none"):
        return model
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            left_to_inductor = compiled and quantization == "none"
            if isinstance(child, nn.Linear) and not left_to_inductor:
                setattr(parent, name, _packed(child, quantization, is_head=name == "lm_head"))
    return model


def _packed(linear: nn.Linear, quantization: str, is_head: bool) -> nn.Module:
    if quantization == "int4" and not is_head:
        return Int4Linear(linear.weight, linear.bias)
    if quantization in ("int4", "int8"):
        return Int8Linear(linear.weight, linear.bias)
    return OneDNNLinear(linear.weight, linear.bias)
