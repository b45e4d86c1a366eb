"""Catalogs: coverage, sources, published figures, user files and overrides."""

import json

import pytest

from specwise.calc.catalog import GIB, ModelSpec, get_gpu, get_model, gpu_names, model_names
from specwise.errors import ConfigError, InputError

GPUS = ("h100-sxm", "h100-pcie", "h200", "b200", "a100-40gb", "a100-80gb", "l40s", "l4", "a10g", "mi300x")
MODELS = ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen2.5-0.5b",
          "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b", "mistral-7b",
          "smollm2-135m", "smollm2-360m", "smollm2-1.7b")


def test_every_required_entry_is_there_with_a_source():
    assert set(GPUS) <= set(gpu_names())
    assert set(MODELS) <= set(model_names())
    for name in gpu_names():
        assert get_gpu(name).source.startswith(("NVIDIA", "AMD", "AWS"))
    for name in model_names():
        assert "huggingface.co" in get_model(name).source


def test_gpu_figures_are_dense_spec_sheet_numbers():
    h100 = get_gpu("H100 SXM")
    assert (h100.memory_gb, h100.bandwidth_gbs, h100.bf16_tflops, h100.fp8_tflops) == (80, 3350, 989.5, 1979)
    assert get_gpu("h200").bandwidth_gbs == 4800
    assert get_gpu("a100-80gb").fp8_tflops is None
    assert get_gpu("mi300x").bf16_tflops == 1307.4
    for name in gpu_names():
        gpu = get_gpu(name)
        if gpu.fp8_tflops is not None:
            # FP8 doubles BF16 at the same (dense) basis; the L40S sheet's own figures differ by 1.2%
            assert gpu.fp8_tflops == pytest.approx(2 * gpu.bf16_tflops, rel=0.02)
    assert get_gpu("h100").memory_bytes == 80 * GIB


def test_parameter_counts_match_model_cards():
    for name in model_names():
        model = get_model(name)
        published = model.published_parameters
        value = float(published[:-1]) * (1e9 if published.endswith("B") else 1e6)
        assert model.num_parameters == pytest.approx(value, rel=0.01), name
        assert model.num_parameters == model.architecture_parameters()


def test_llama_architecture_figures():
    llama = get_model("meta llama 3.1 8b instruct".replace("meta ", "").replace(" ", "-"))
    assert (llama.num_layers, llama.hidden_size, llama.num_heads, llama.num_kv_heads, llama.head_dim) == (
        32, 4096, 32, 8, 128)
    assert llama.kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2 == 131072
    assert llama.streamed_parameters == llama.num_parameters - 128256 * 4096
    tied = get_model("llama-3.2-1b")
    assert tied.tie_word_embeddings and tied.streamed_parameters == tied.num_parameters
    assert get_model("Llama-3-70B") is get_model("llama-3.1-70b")


def test_unknown_name_lists_the_catalog():
    with pytest.raises(ConfigError, match="h100-sxm"):
        get_gpu("h900")
    with pytest.raises(ConfigError, match="llama-3.1-8b"):
        get_model("llama-9")


def test_user_gpu_file(tmp_path):
    path = tmp_path / "mygpu.json"
    path.write_text(json.dumps({"name": "lab-card", "memory_gb": 32, "bandwidth_gbs": 1000, "bf16_tflops": 200}))
    gpu = get_gpu(str(path))
    assert (gpu.name, gpu.bandwidth_gbs, gpu.fp8_tflops) == ("lab-card", 1000, None)
    path.write_text(json.dumps({"memory_gb": 32, "bandwidth": 1000}))
    with pytest.raises(InputError, match="bandwidth"):
        get_gpu(str(path))
    with pytest.raises(InputError):
        get_gpu(str(tmp_path / "missing.json"))


def test_hf_config_json_is_a_model(tmp_path):
    config = {"model_type": "qwen2", "num_hidden_layers": 24, "hidden_size": 896, "num_attention_heads": 14,
              "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
              "tie_word_embeddings": True}
    path = tmp_path / "Qwen2.5-0.5B" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    model = get_model(str(path))
    assert model.name == "Qwen2.5-0.5B" and model.head_dim == 64 and model.attention_bias
    assert model.num_parameters == get_model("qwen2.5-0.5b").num_parameters


def test_overrides_change_one_figure_and_recount_parameters():
    gpu = get_gpu("h100-sxm", ["bandwidth_gbs=3000", "fp8_tflops=none"])
    assert gpu.bandwidth_gbs == 3000 and gpu.fp8_tflops is None and "changed" in gpu.source
    deeper = get_model("llama-3.1-8b", ["num_layers=40"])
    assert deeper.num_parameters == deeper.architecture_parameters() > get_model("llama-3.1-8b").num_parameters
    with pytest.raises(ConfigError):
        get_gpu("h100-sxm", ["speed=3"])
    with pytest.raises(ConfigError):
        get_gpu("h100-sxm", ["bandwidth_gbs=fast"])
    with pytest.raises(ConfigError):
        get_gpu("h100-sxm", ["bandwidth_gbs=-1"])


def test_model_validation():
    with pytest.raises(ConfigError):
        ModelSpec(name="bad", num_layers=2, hidden_size=64, num_heads=6, num_kv_heads=4, head_dim=16,
                  intermediate_size=128, vocab_size=100)
