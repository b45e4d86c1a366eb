"""Weight formats for CPU decoding: fewer bytes per step through well-kept PyTorch kernels.

Decoding a few sequences reads every weight once per step, so a step costs about
weight bytes / memory bandwidth. Each format swaps the model's Linear layers for one of:

  fp32     oneDNN with the weight reordered once into its blocked layout
  bf16     (torch.ops.mkldnn._reorder_linear_weight / _linear_pointwise): 4 or 2 bytes a weight
  int8     per-output-channel symmetric int8 (torch.ops.aten._weight_int8pack_mm): 1 byte
  int4     groups of 32 along the input, asymmetric, tinygemm layout
           (torch.ops.aten._weight_int4pack_mm_for_cpu): half a byte plus a scale and zero per group;
           the LM head stays int8 (int4 there moved the top-1 token on 15% of positions, int8 on 3%)

int8 and int4 run with bfloat16 activations: with fp32 activations these kernels fall back
to scalar code, 3-100x slower than fp32 matmuls (measured on an AVX-512 CPU, torch 2.13).

Where a kernel does not run on this CPU (capabilities.py probes each once), the layer takes a path
that works everywhere: fp32 and bf16 layers stay plain nn.Linear; int8 and int4 layers keep their weights
unpacked and dequantize them at each call (the same numbers as the kernel, within bf16 rounding).

Worked example (int4, one group of 4 for brevity): weights [0.1, 0.5, -0.3, 0.2] ->
min -0.3, max 0.5, scale = 0.8 / 15 = 0.0533, zero = min + 8 * scale = 0.1267;
q = round((w - min) / scale) = [7, 15, 0, 9]; dequantized (q - 8) * scale + zero =
[0.073, 0.5, -0.3, 0.18]: every weight within scale / 2 of the original.
A GGUF checkpoint stored as Q4_0/Q4_1 (groups of 32) requantizes to int4 almost exactly.
"""

import torch
import torch.nn.functional as F
from torch import nn

from specwise.config import QUANTIZATIONS
from specwise.errors import ConfigError
from specwise.models import capabilities

INT4_GROUP_SIZE = 32


class OneDNNLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.weight_bytes = weight.numel() * dtype.itemsize                 # the packed copy is not a buffer
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype).contiguous(),
                                                              capabilities.ONEDNN_BATCH_HINT[dtype])
        self.bias = None if bias is None else bias.to(dtype)

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
        self.kernel = _has_kernel("int8_kernel")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).contiguous()                      # the kernel needs contiguous rows
        if self.kernel:
            out = torch.ops.aten._weight_int8pack_mm(flat, self.weight_int8, self.scales)
        else:                                                               # x @ (q * s).T = (x @ q.T) * s
            out = F.linear(flat, self.weight_int8.to(flat.dtype)) * self.scales
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
        self.kernel = _has_kernel("int4_kernel")
        # the kernel's packed layout, or (without the kernel) one level per byte: [out_features, in_features]
        self.register_buffer("weight_int4", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1) if self.kernel
                             else q.to(torch.uint8))
        scales_and_zeros = torch.stack([scale.squeeze(-1), zero.squeeze(-1)], dim=-1)   # [out, groups, 2]
        self.register_buffer("scales_and_zeros", scales_and_zeros.transpose(0, 1).contiguous().to(torch.bfloat16))
        self.group_size = group_size
        self.bias = None if bias is None else bias.to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).contiguous()                      # the kernel needs contiguous rows
        if self.kernel:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.weight_int4, self.group_size,
                                                              self.scales_and_zeros)
        else:
            out = F.linear(flat, self.dequantized().to(flat.dtype))
        out = out if self.bias is None else out + self.bias
        return out.view(*x.shape[:-1], -1)

    def dequantized(self) -> torch.Tensor:
        """The unpacked levels as weights, (q - 8) * scale + zero: [out_features, in_features] in fp32."""
        out_features, in_features = self.weight_int4.shape
        scale, zero = self.scales_and_zeros.float().transpose(0, 1).unbind(-1)            # [out, groups] each
        levels = self.weight_int4.float().view(out_features, -1, self.group_size)          # [out, groups, group]
        return ((levels - 8) * scale[..., None] + zero[..., None]).view(out_features, in_features)


def pack_weights(model: nn.Module, dtype: torch.dtype, quantization: str, device: str,
                 plain: bool = False) -> nn.Module:
    """Swap the Linear layers of a loaded model for the kernels of its weight format (CPU only; other
    devices and dtypes keep plain nn.Linear). `plain`: unquantized layers stay nn.Linear, LM head included, for
    inductor to pack (models/compile/graphs.py compiles the forward and the LM head) or for training."""
    if quantization not in QUANTIZATIONS:
        raise ConfigError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    if quantization != "none" and dtype != torch.bfloat16:
        raise ConfigError(f"{quantization} weights run with bfloat16 activations on CPU: use --dtype bfloat16")
    kernel = capabilities.ONEDNN_KERNEL.get(dtype)
    # unquantized: packed for oneDNN where this CPU runs its kernel for the dtype, else nn.Linear as inductor gets it
    if device != "cpu" or (quantization == "none" and (plain or kernel is None or not _has_kernel(kernel))):
        return model
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, _packed(child, dtype, quantization, is_head=name == "lm_head"))
    return model


def _packed(linear: nn.Linear, dtype: torch.dtype, quantization: str, is_head: bool) -> nn.Module:
    if quantization == "int4" and not is_head:
        return Int4Linear(linear.weight, linear.bias)
    if quantization in ("int4", "int8"):
        return Int8Linear(linear.weight, linear.bias)
    return OneDNNLinear(linear.weight, linear.bias, dtype)


def bf16_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> nn.Module:
    """A bf16 linear layer on the fastest path this CPU runs: oneDNN packed, else plain."""
    if _has_kernel("onednn_bf16"):
        return OneDNNLinear(weight, bias)
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias is not None:
            linear.bias.copy_(bias)
    return linear.requires_grad_(False)


def _has_kernel(name: str) -> bool:
    """Whether this CPU runs a kernel (capabilities.py); a missing one is said once on stderr."""
    runs = getattr(capabilities.cpu_capabilities(), name)
    if not runs:
        capabilities.note_fallback(name)
    return runs
