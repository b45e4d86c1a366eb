"""Weight formats: each kernel wrapper against a plain matmul on random weights, the packing of a
model, config errors, and (integration) the default model's logits next to its fp32 logits."""

import pytest
import torch
from torch import nn

from specwise.config import EngineConfig
from specwise.errors import ConfigError
from specwise.models import capabilities
from specwise.models.quantize import Int4Linear, Int8Linear, OneDNNLinear, bf16_linear, pack_weights
from capability_marks import cpu_kernels, needs_onednn_bf16, needs_onednn_fp32, pretend_missing

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


@needs_onednn_fp32
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_onednn_fp32_matches_a_plain_matmul_to_fp32_rounding(rows):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 128, generator=generator) * 0.05
    bias = torch.randn(96, generator=generator)
    x = torch.randn(rows, 128, generator=generator)
    layer = OneDNNLinear(weight, bias, torch.float32)
    out = layer(x)
    assert out.dtype == torch.float32 and layer.weight_bytes == 96 * 128 * 4
    torch.testing.assert_close(out, torch.nn.functional.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    assert layer(x.expand(2, rows, 128)).shape == (2, rows, 96)


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


@pytest.mark.parametrize("dtype, quantization, kinds", [
    pytest.param(torch.bfloat16, "none", (OneDNNLinear, OneDNNLinear), marks=needs_onednn_bf16),
    pytest.param(torch.float32, "none", (OneDNNLinear, OneDNNLinear), marks=needs_onednn_fp32),
    (torch.bfloat16, "int8", (Int8Linear, Int8Linear)), (torch.bfloat16, "int4", (Int4Linear, Int8Linear))])
def test_pack_weights_swaps_every_linear_and_keeps_the_head_at_int8(dtype, quantization, kinds):
    model = pack_weights(TwoLinears(), dtype, quantization, "cpu")
    assert (type(model.proj), type(model.lm_head)) == kinds


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_plain_keeps_nn_linear_for_inductor_and_training(dtype):
    model = pack_weights(TwoLinears(), dtype, "none", "cpu", plain=True)
    assert type(model.proj) is nn.Linear and type(model.lm_head) is nn.Linear
    assert type(pack_weights(TwoLinears(), dtype, "none", "meta").proj) is nn.Linear       # CPU only


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


@pytest.mark.parametrize("dtype, capability", [(torch.bfloat16, "onednn_bf16"), (torch.float32, "onednn_fp32")])
def test_without_onednn_linears_stay_plain_with_the_same_outputs(monkeypatch, capsys, dtype, capability):
    model = TwoLinears().to(dtype).requires_grad_(False)
    x = torch.randn(3, 64).to(dtype)
    reference = model.proj(x).float()
    pretend_missing(monkeypatch, capability)
    packed = pack_weights(model, dtype, "none", "cpu")
    assert type(packed.proj) is nn.Linear and type(packed.lm_head) is nn.Linear
    assert torch.equal(packed.proj(x).float(), reference)
    assert capabilities.NEEDS[capability] in capsys.readouterr().err


def test_bf16_linear_without_onednn_is_plain(monkeypatch):
    model = TwoLinears().to(torch.bfloat16).requires_grad_(False)
    x = torch.randn(3, 64).to(torch.bfloat16)
    pretend_missing(monkeypatch, "onednn_bf16")
    head = bf16_linear(model.lm_head.weight.float())
    assert type(head) is nn.Linear and head.weight.dtype == torch.bfloat16
    assert relative_error(head(x), x.float() @ model.lm_head.weight.float().T) < BOUNDS[OneDNNLinear]


def test_the_start_up_words_name_the_path_each_capability_gives(monkeypatch):
    assert "oneDNN packed" in capabilities.linear_path(torch.bfloat16, "none", "cpu") or \
        not capabilities.cpu_capabilities().onednn_bf16
    assert capabilities.linear_path(torch.float32, "none", "cpu") == "fp32 oneDNN packed" or \
        not capabilities.cpu_capabilities().onednn_fp32
    pretend_missing(monkeypatch, "onednn_bf16", "int8_kernel")
    assert capabilities.linear_path(torch.bfloat16, "none", "cpu") == "bf16 plain matmul (no oneDNN bf16 here)"
    assert capabilities.linear_path(torch.bfloat16, "int8", "cpu") == "int8 dequantized per call, bf16 activations"
    assert capabilities.linear_path(torch.bfloat16, "none", "cpu", compiled=True) == "bf16 inductor-compiled"
    pretend_missing(monkeypatch, "onednn_bf16", "onednn_fp32")
    assert capabilities.describe_kernels(torch.float32, "none", "cpu").startswith(
        "fp32, linears: fp32 plain matmul (no oneDNN fp32 here) (CPU ")
    assert capabilities.linear_path(torch.float16, "none", "cpu") == "fp16 PyTorch matmul"
    assert capabilities.compute_dtype("auto", "cpu") == torch.float32       # no oneDNN bf16: no native bf16 either
