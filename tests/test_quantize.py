"""Weight formats: each kernel wrapper against a plain matmul on random weights, the packing of a
model, config errors, and (integration) the default model's logits next to its fp32 logits."""

import pytest
import torch
from torch import nn

from specwise.config import EngineConfig
from specwise.errors import ConfigError
from specwise.models import capabilities
from specwise.models.quantize import Int4Linear, Int8Linear, OneDNNLinear, bf16_linear, pack_weights
from capability_marks import cpu_kernels, needs_onednn_bf16, pretend_missing

pytestmark = cpu_kernels

# relative Frobenius error of the output against x @ W.T in fp32, per format (inputs ~N(0, 1),
# weights ~N(0, 0.05)): bf16 rounds activations and weights to 8 bits of mantissa; int8 and int4
# add their own rounding (int4: 16 levels per group of 32)
BOUNDS = {OneDNNLinear: 0.01, Int8Linear: 0.02, Int4Linear: 0.12}


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours.float() - reference).norm() / reference.norm())


@pytest.mark.parametrize("kind", [pytest.param(OneDNNLinear, marks=needs_onednn_bf16), Int8Linear, Int4Linear])
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_each_kernel_matches_a_plain_matmul(kind, rows):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 128, generator=generator) * 0.05
    bias = torch.randn(96, generator=generator)
    x = torch.randn(rows, 128, generator=generator)
    layer = kind(weight, bias)
    out = layer(x.to(torch.bfloat16))
    assert out.shape == (rows, 96) and out.dtype == torch.bfloat16
    assert relative_error(out, x @ weight.T + bias) < BOUNDS[kind]
    # leading dimensions are kept: [2, rows, 128] -> [2, rows, 96]
    assert layer(x.to(torch.bfloat16).expand(2, rows, 128)).shape == (2, rows, 96)


def test_int4_keeps_weights_already_on_its_grid():
    # weights with 16 levels per group of 32 (as a Q4 GGUF stores them) lose only the bf16 rounding
    # of scales, zeros and activations: far below the 0.12 of random weights
    generator = torch.Generator().manual_seed(0)
    levels = torch.randint(0, 16, (64, 128), generator=generator).float()
    scales = torch.rand(64, 4, 1, generator=generator) * 0.01 + 0.001
    weight = (levels.view(64, 4, 32) * scales - 0.05).view(64, 128)
    x = torch.randn(3, 128, generator=generator).to(torch.bfloat16)
    reference = x.float() @ weight.T
    assert relative_error(Int4Linear(weight, None)(x), reference) < 0.03


class TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(64, 64)
        self.lm_head = nn.Linear(64, 32, bias=False)


@pytest.mark.parametrize("quantization, kinds", [pytest.param("none", (OneDNNLinear, OneDNNLinear),
                                                              marks=needs_onednn_bf16),
                                                 ("int8", (Int8Linear, Int8Linear)),
                                                 ("int4", (Int4Linear, Int8Linear))])
def test_pack_weights_swaps_every_linear_and_keeps_the_head_at_int8(quantization, kinds):
    model = pack_weights(TwoLinears(), torch.bfloat16, quantization, "cpu")
    assert (type(model.proj), type(model.lm_head)) == kinds


def test_fp32_keeps_plain_linears():
    model = pack_weights(TwoLinears(), torch.float32, "none", "cpu")
    assert type(model.proj) is nn.Linear


@pytest.mark.parametrize("kwargs, fragment", [(dict(quantization="int8", dtype="float32"), "--dtype bfloat16"),
                                              (dict(quantization="fp8", dtype="bfloat16"), "none, int8, int4")])
def test_bad_quantization_settings(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        EngineConfig(**kwargs)


@pytest.mark.integration
@pytest.mark.parametrize("dtype, quantization, compile, bound, agreement", [
    ("bfloat16", "none", False, 0.03, 0.95), ("bfloat16", "int8", False, 0.05, 0.90),
    ("bfloat16", "int4", False, 0.05, 0.90), ("bfloat16", "none", True, 0.03, 0.95)])
def test_default_model_logits_stay_near_fp32(dtype, quantization, compile, bound, agreement):
    """A prompt's logits at every position (a prefill), then one decode step's (its last token fed again, the
    same input for both), next to fp32's."""
    from specwise.engine.llm import LLM
    text = ("Speculative decoding lets a small drafter propose tokens that the target model checks in one "
            "forward pass, so the output is exactly what the target alone would have written.")
    reference = LLM(num_kv_blocks=64, dtype="float32")             # not "auto": that is bf16 on most CPUs now
    ids = reference.tokenizer.encode(text)
    table = list(range(reference.engine.runner.blocks_for(len(ids) + 1)))
    tested = LLM(num_kv_blocks=64, dtype=dtype, quantization=quantization, compile=compile)
    fp32, ours = (torch.cat([runner.forward([ids], [0], [table], num_logits=[len(ids)]),
                             runner.forward([[ids[-1]]], [len(ids)], [table], num_logits=[1])])
                  for runner in (reference.engine.runner, tested.engine.runner))
    error = relative_error(ours, fp32)
    same_top1 = float((ours.argmax(-1) == fp32.argmax(-1)).float().mean())
    print(f"\n[{dtype} {quantization} compile={compile}] relative logit error {error:.4f}, "
          f"top-1 agreement {same_top1:.3f}")
    assert error < bound and same_top1 >= agreement


@pytest.mark.parametrize("native, expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_dtype_follows_the_cpus_bf16_instructions(monkeypatch, native, expected):
    caps = capabilities.cpu_capabilities()
    monkeypatch.setattr(capabilities, "cpu_capabilities",
                        lambda: capabilities.Capabilities(**dict(caps.to_dict(), native_bf16=native)))
    assert capabilities.compute_dtype("auto", "cpu") == expected
    assert capabilities.compute_dtype("float32", "cpu") == torch.float32


# ----------------------------------------------------------------------------- fallbacks where a kernel is missing


@pytest.mark.parametrize("kind, capability", [(Int8Linear, "int8_kernel"), (Int4Linear, "int4_kernel")])
def test_a_missing_weight_kernel_falls_back_to_the_same_outputs(monkeypatch, capsys, kind, capability):
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(96, 128, generator=generator) * 0.05
    bias = torch.randn(96, generator=generator)
    x = torch.randn(5, 128, generator=generator).to(torch.bfloat16)
    with_kernel = kind(weight, bias)
    assert with_kernel.kernel                       # this CPU has it (the probe ran); else the comparison is moot
    pretend_missing(monkeypatch, capability)
    fallback, second = kind(weight, bias), kind(weight, bias)
    assert not fallback.kernel
    # the same quantized weights, another summation order: within bf16 rounding of each other
    assert relative_error(fallback(x), with_kernel(x).float()) < 0.01
    assert relative_error(fallback(x), x.float() @ weight.T + bias) < BOUNDS[kind]
    assert second(x.expand(2, 5, 128)).shape == (2, 5, 96)
    assert capsys.readouterr().err.count("does not run on this CPU") == 1       # said once, not per layer


def test_bf16_without_onednn_keeps_plain_linears_with_the_same_outputs(monkeypatch):
    model = TwoLinears().to(torch.bfloat16).requires_grad_(False)
    x = torch.randn(3, 64).to(torch.bfloat16)
    reference = model.proj(x).float()
    pretend_missing(monkeypatch, "onednn_bf16")
    packed = pack_weights(model, torch.bfloat16, "none", "cpu")
    assert type(packed.proj) is nn.Linear and type(packed.lm_head) is nn.Linear
    assert torch.equal(packed.proj(x).float(), reference)
    head = bf16_linear(model.lm_head.weight.float())
    assert type(head) is nn.Linear and head.weight.dtype == torch.bfloat16
    assert relative_error(head(x), x.float() @ model.lm_head.weight.float().T) < BOUNDS[OneDNNLinear]


def test_the_start_up_words_name_the_path_each_capability_gives(monkeypatch):
    assert "oneDNN packed" in capabilities.linear_path(torch.bfloat16, "none", "cpu") or \
        not capabilities.cpu_capabilities().onednn_bf16
    pretend_missing(monkeypatch, "onednn_bf16", "int8_kernel")
    assert capabilities.linear_path(torch.bfloat16, "none", "cpu") == "bf16 plain matmul (no oneDNN bf16 here)"
    assert capabilities.linear_path(torch.bfloat16, "int8", "cpu") == "int8 dequantized per call, bf16 activations"
    assert capabilities.linear_path(torch.bfloat16, "none", "cpu", compiled=True) == "bf16 inductor-compiled"
    assert capabilities.describe_kernels(torch.float32, "none", "cpu").startswith("fp32, linears: fp32 PyTorch matmul (CPU ")
    assert capabilities.compute_dtype("auto", "cpu") == torch.float32       # no oneDNN bf16: no native bf16 either
