"""What this machine can run, decided in one place: the dtype `auto` means and the kernel each layer runs.

CPUs differ in what PyTorch's fast paths need, and a kernel that is missing raises at its first call
(oneDNN's bf16 linear on an AVX2-only CPU: "bf16 path needs the cpu support avx_ne_convert or avx512bw,
avx512vl and avx512dq"). So each fast kernel is probed once, on a tiny input, and a layer whose kernel
did not run takes a path that works everywhere: slower, said once on stderr, never a traceback.

    capability       probe (a few microseconds, once a process)              fallback when it fails
    onednn_fp32      mkldnn._reorder_linear_weight + _linear_pointwise         plain F.linear in fp32
    onednn_bf16      the same in bf16                                          plain F.linear in bf16
    int8_kernel      aten._weight_int8pack_mm                                 int8 weights dequantized per call
    int4_kernel      aten._convert_weight_to_int4pack_for_cpu + _mm_for_cpu   int4 weights dequantized per call

`native_bf16` (the CPU computes bf16 in hardware: x86 avx512_bf16 / amx_bf16, ARM bf16) decides
what `--dtype auto` means, together with oneDNN's own check: held to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2,
ATEN_CPU_CAPABILITY=avx2) an AVX-512 CPU reports no oneDNN bf16, as a real AVX2-only CPU does, and
`auto` is float32 on both.

Example: on an AMD EPYC with AVX2 only, `auto` is fp32 and runs oneDNN's packed fp32 linear, `--dtype
bfloat16` runs every linear as a plain bf16 matmul (one note on stderr), `--quantization int8` runs the int8
kernel (it has an AVX2 path).
"""

import functools
import platform
import sys
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class Capabilities:
    isa: str                    # PyTorch's vector kernels: torch.backends.cpu.get_cpu_capability() (AVX512, AVX2, ...)
    native_bf16: bool           # bf16 arithmetic in hardware, and oneDNN allowed to use it
    onednn_fp32: bool           # oneDNN's packed fp32 linear runs here
    onednn_bf16: bool           # oneDNN's packed bf16 linear runs here
    int8_kernel: bool           # aten._weight_int8pack_mm runs here
    int4_kernel: bool           # aten._weight_int4pack_mm_for_cpu runs here

    def to_dict(self) -> dict:
        return asdict(self)


# oneDNN lays a packed weight out for a batch-size hint: bf16 for one row, fp32 for any (None). On an AVX2-only
# EPYC (2 threads) fp32's LM head, 576 -> 49,152, took 5.2 ms at 4 rows packed for any against 8.8 packed for one
# row and 9.1 unpacked, and the same at 1 row; gate_up at 256 rows 7.7 against 7.5 and 8.0 ms.
ONEDNN_BATCH_HINT = {torch.bfloat16: 1, torch.float32: None}
ONEDNN_KERNEL = {torch.float32: "onednn_fp32", torch.bfloat16: "onednn_bf16"}     # the capability each one needs

# what each fast path needs, for the one-line notes and errors
NEEDS = {
    "onednn_fp32": "oneDNN's packed fp32 linear",
    "onednn_bf16": "oneDNN's bf16 linear (needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT on x86)",
    "int8_kernel": "PyTorch's int8 weight kernel",
    "int4_kernel": "PyTorch's int4 weight kernel",
}


@functools.cache
def cpu_capabilities() -> Capabilities:
    """This process's CPU, probed once (the environment that holds PyTorch to an ISA is read at import)."""
    onednn_bf16 = _runs(functools.partial(_probe_onednn, torch.bfloat16))
    return Capabilities(isa=torch.backends.cpu.get_cpu_capability(),
                        native_bf16=onednn_bf16 and _cpu_flags_have_bf16(),
                        onednn_fp32=_runs(functools.partial(_probe_onednn, torch.float32)),
                        onednn_bf16=onednn_bf16, int8_kernel=_runs(_probe_int8), int4_kernel=_runs(_probe_int4))


def compute_dtype(name: str, device: str) -> torch.dtype:
    """`auto`: bfloat16 where the hardware computes it natively (a CPU with native bf16 that oneDNN may use,
    or a GPU that supports it), else float32; any other name is taken as it is."""
    if name != "auto":
        return getattr(torch, name)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if device == "cpu" and cpu_capabilities().native_bf16 else torch.float32


def linear_path(dtype: torch.dtype, quantization: str, device: str, compiled: bool = False) -> str:
    """In a few words, what a Linear layer of the model runs (the start-up line and run.json name it)."""
    if device != "cpu":
        return f"{_dtype_name(dtype)} PyTorch matmul on {device}"
    caps = cpu_capabilities()
    if quantization in ("int8", "int4"):
        kernel = f"{quantization}_kernel"
        how = f"{quantization} weight kernel" if getattr(caps, kernel) else f"{quantization} dequantized per call"
        return f"{how}, bf16 activations"
    if compiled:
        return f"{_dtype_name(dtype)} inductor-compiled"
    kernel = ONEDNN_KERNEL.get(dtype)
    if kernel is None:
        return f"{_dtype_name(dtype)} PyTorch matmul"
    name = _dtype_name(dtype)
    return f"{name} oneDNN packed" if getattr(caps, kernel) else f"{name} plain matmul (no oneDNN {name} here)"


def describe_kernels(dtype: torch.dtype, quantization: str, device: str, compiled: bool = False) -> str:
    """The start-up line's words: dtype, linear path and the CPU's ISA."""
    where = device if device != "cpu" else f"CPU {cpu_capabilities().isa}, {platform.machine()}"
    return f"{_dtype_name(dtype)}, linears: {linear_path(dtype, quantization, device, compiled)} ({where})"


@functools.cache
def note_fallback(capability: str) -> None:
    """Say once a process that a slower path replaces a fast kernel this CPU lacks."""
    print(f"specwise: note: {NEEDS[capability]} does not run on this CPU; using a slower path that works "
          f"everywhere", file=sys.stderr, flush=True)


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def _runs(probe) -> bool:
    try:
        probe()
    except (RuntimeError, NotImplementedError, AttributeError):
        return False
    return True


def _probe_onednn(dtype: torch.dtype) -> None:
    weight = torch.ones(16, 32, dtype=dtype)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, ONEDNN_BATCH_HINT[dtype])
    torch.ops.mkldnn._linear_pointwise(torch.ones(1, 32, dtype=dtype), packed, None, "none", [], "")


def _probe_int8() -> None:
    torch.ops.aten._weight_int8pack_mm(torch.ones(1, 32, dtype=torch.bfloat16), torch.ones(16, 32, dtype=torch.int8),
                                       torch.ones(16, dtype=torch.bfloat16))


def _probe_int4() -> None:
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.ones(16, 32, dtype=torch.int32), 1)
    scales_and_zeros = torch.ones(1, 16, 2, dtype=torch.bfloat16)           # [groups, out_features, 2]
    torch.ops.aten._weight_int4pack_mm_for_cpu(torch.ones(1, 32, dtype=torch.bfloat16), packed, 32, scales_and_zeros)


def _cpu_flags_have_bf16() -> bool:
    """x86: avx512_bf16 or amx_bf16 in /proc/cpuinfo's flags; ARM: bf16 in its Features."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as stream:
            for line in stream:
                if line.startswith(("flags", "Features")):
                    flags = line.split(":", 1)[-1].split()
                    return bool({"avx512_bf16", "amx_bf16", "bf16"} & set(flags))
    except OSError:
        pass
    return False
