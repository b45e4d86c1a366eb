import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from specwise.errors import ModelLoadError
from specwise.models.checkpoints import loader
from specwise.models.checkpoints.loader import load_checkpoint
from specwise.models.config import ModelConfig
from capability_marks import cpu_kernels
from tiny_checkpoints import (make_tiny_hf_config, random_state_dict, real_model_path,  # noqa: F401 (fixture)
                              write_gguf_checkpoint, write_hf_checkpoint)

QUANT_TOLERANCE = {"F16": 1e-3, "BF16": 8e-3, "Q8_0": 1e-2, "Q5_0": 0.05, "Q5_1": 0.05, "Q4_0": 0.15, "Q4_1": 0.15}


def load_error(path) -> str:
    with pytest.raises(ModelLoadError) as caught:
        load_checkpoint(path)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("arch, tie, shards", [("llama", False, 1), ("qwen2", True, 2), ("mistral", True, 3)])
def test_hf_directory_round_trips_exactly(tmp_path, arch, tie, shards):
    hf_config = make_tiny_hf_config(arch, tie=tie)
    state = random_state_dict(hf_config, seed=1)
    checkpoint = load_checkpoint(write_hf_checkpoint(tmp_path / "model", hf_config, state, shards=shards))
    assert checkpoint.config == ModelConfig.from_hf(hf_config)
    assert set(checkpoint.weights) == set(state)
    assert ("lm_head.weight" in checkpoint.weights) == (not tie)
    assert ("model.layers.0.self_attn.k_proj.bias" in checkpoint.weights) == (arch == "qwen2")
    for name, tensor in state.items():
        assert torch.equal(checkpoint.weights[name], tensor), name
    assert checkpoint.path == tmp_path / "model"


@cpu_kernels
def test_hf_weights_are_cast_to_the_compute_dtype_and_extra_tensors_dropped(tmp_path):
    hf_config = make_tiny_hf_config("llama", tie=True)
    state = random_state_dict(hf_config)
    extra = {"lm_head.weight": state["model.embed_tokens.weight"].clone(), "model.rotary_emb.inv_freq": torch.ones(8)}
    checkpoint = load_checkpoint(write_hf_checkpoint(tmp_path, hf_config, state | extra), dtype=torch.bfloat16)
    assert set(checkpoint.weights) == set(state)
    assert all(t.dtype == torch.bfloat16 for t in checkpoint.weights.values())
    assert torch.equal(checkpoint.weights["model.norm.weight"], state["model.norm.weight"].bfloat16())


@pytest.mark.parametrize("arch, tie", [("llama", False), ("llama", True), ("qwen2", True), ("qwen2", False)])
def test_gguf_f32_matches_the_hf_checkpoint_exactly(tmp_path, arch, tie):
    # The writer applies llama.cpp's q/k row permutation for llama; loading must undo it bit for bit.
    hf_config = make_tiny_hf_config(arch, tie=tie)
    state = random_state_dict(hf_config, seed=2)
    checkpoint = load_checkpoint(write_gguf_checkpoint(tmp_path / "m.gguf", hf_config, state, "F32"))
    assert checkpoint.config == ModelConfig.from_hf(hf_config)
    assert set(checkpoint.weights) == set(state)
    for name, tensor in state.items():
        assert torch.equal(checkpoint.weights[name], tensor), name


@pytest.mark.parametrize("qtype", list(QUANT_TOLERANCE))
def test_gguf_quantized_tensors_dequantize_like_the_gguf_package(tmp_path, qtype):
    hf_config = make_tiny_hf_config("llama")
    state = random_state_dict(hf_config, seed=3)
    checkpoint = load_checkpoint(write_gguf_checkpoint(tmp_path / "m.gguf", hf_config, state, qtype))
    kind = gguf.GGMLQuantizationType[qtype]
    for name, tensor in state.items():
        loaded = checkpoint.weights[name]
        assert loaded.shape == tensor.shape and loaded.dtype == torch.float32
        if tensor.ndim == 1:
            assert torch.equal(loaded, tensor)
            continue
        # Quantization is row-wise, so it commutes with the q/k row permutation.
        reference = gguf.quants.dequantize(gguf.quants.quantize(tensor.numpy(), kind), kind)
        np.testing.assert_allclose(loaded.numpy(), reference.reshape(tensor.shape), rtol=1e-6, atol=1e-7)
        error = (loaded - tensor).abs().max() / tensor.abs().max()
        assert error < QUANT_TOLERANCE[qtype], name


def test_gguf_k_quant_tensor_is_read(tmp_path):
    hf_config = make_tiny_hf_config("llama", intermediate_size=256)   # K-quants pack 256 values per block
    state = random_state_dict(hf_config)
    name = "model.layers.0.mlp.down_proj.weight"
    path = write_gguf_checkpoint(tmp_path / "m.gguf", hf_config, state, tensor_qtypes={name: "Q4_K"})
    loaded = load_checkpoint(path).weights[name]
    assert loaded.shape == (64, 256) and not loaded.any()   # the writer stored zero blocks


def test_gguf_llama3_rope_frequencies_become_hf_rope_scaling(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    hf_config = make_tiny_hf_config("llama", hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                                    rope_theta=500000.0, rope_scaling=scaling)
    path = write_gguf_checkpoint(tmp_path / "m.gguf", hf_config, random_state_dict(hf_config))
    recovered = load_checkpoint(path).config.rope_scaling
    assert recovered.keys() == scaling.keys()
    for key, value in scaling.items():
        assert recovered[key] == pytest.approx(value, rel=1e-3), key


def test_gguf_linear_rope_scaling_is_read(tmp_path):
    hf_config = make_tiny_hf_config("llama", rope_scaling={"rope_type": "linear", "factor": 4.0})
    path = write_gguf_checkpoint(tmp_path / "m.gguf", hf_config, random_state_dict(hf_config))
    assert load_checkpoint(path).config.rope_scaling == {"rope_type": "linear", "factor": 4.0}


def test_directory_holding_one_gguf_file_loads_that_file(tmp_path):
    hf_config = make_tiny_hf_config("qwen2", tie=True)
    write_gguf_checkpoint(tmp_path / "only.gguf", hf_config, random_state_dict(hf_config))
    assert load_checkpoint(tmp_path).path == tmp_path / "only.gguf"


def test_no_path_loads_the_default_model(tmp_path, monkeypatch):
    hf_config = make_tiny_hf_config("llama", tie=True)
    path = write_gguf_checkpoint(tmp_path / "default.gguf", hf_config, random_state_dict(hf_config))
    monkeypatch.setattr(loader, "default_model_path", lambda: path)
    checkpoint = load_checkpoint(None)
    assert checkpoint.path == path
    assert checkpoint.config.eos_token_ids == checkpoint.tokenizer.eos_token_ids == [2]


def test_missing_path(tmp_path):
    assert load_error(tmp_path / "nope") == f"{tmp_path / 'nope'}: no such file or directory"


def test_directory_without_config(tmp_path):
    assert load_error(tmp_path).startswith(f"{tmp_path}: no config.json here")


def test_unknown_model_type(tmp_path):
    hf_config = make_tiny_hf_config("llama")
    write_hf_checkpoint(tmp_path, hf_config | {"model_type": "gpt_neox"}, random_state_dict(hf_config))
    assert load_error(tmp_path) == (f"{tmp_path / 'config.json'}: model_type 'gpt_neox' is not supported "
                                    "(supported: llama, mistral, qwen2)")


def test_unsupported_rope_scaling(tmp_path):
    hf_config = make_tiny_hf_config("llama")
    state = random_state_dict(hf_config)
    write_hf_checkpoint(tmp_path, hf_config | {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, state)
    assert "rope_scaling type 'yarn' is not supported" in load_error(tmp_path)


def test_missing_tensor_is_named(tmp_path):
    hf_config = make_tiny_hf_config("llama")
    state = random_state_dict(hf_config)
    del state["model.layers.1.mlp.up_proj.weight"]
    write_hf_checkpoint(tmp_path, hf_config, state)
    assert load_error(tmp_path) == f"{tmp_path}: missing tensor model.layers.1.mlp.up_proj.weight"


def test_misshapen_tensor_is_named(tmp_path):
    hf_config = make_tiny_hf_config("llama")
    state = random_state_dict(hf_config)
    state["model.norm.weight"] = torch.ones(63)
    write_hf_checkpoint(tmp_path, hf_config, state)
    assert load_error(tmp_path) == f"{tmp_path}: tensor model.norm.weight has shape [63], the config implies [64]"


def test_corrupt_and_truncated_safetensors(tmp_path):
    hf_config = make_tiny_hf_config("llama")
    write_hf_checkpoint(tmp_path, hf_config, random_state_dict(hf_config))
    file = tmp_path / "model.safetensors"
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    assert load_error(tmp_path).startswith(f"{file}: cannot read safetensors file")
    file.write_bytes(b"this is not a safetensors file at all")
    assert load_error(tmp_path).startswith(f"{file}: cannot read safetensors file")


def test_shard_listed_in_index_but_missing(tmp_path):
    hf_config = make_tiny_hf_config("llama")
    write_hf_checkpoint(tmp_path, hf_config, random_state_dict(hf_config), shards=2)
    shard = tmp_path / "model-00002-of-00002.safetensors"
    shard.unlink()
    assert load_error(tmp_path) == f"{shard}: shard listed in model.safetensors.index.json is missing"


def test_file_that_is_neither_gguf_nor_directory(tmp_path):
    file = tmp_path / "weights.bin"
    save_file({"x": torch.ones(2)}, file)
    assert load_error(file).endswith("not a GGUF file or a Hugging Face model directory (config.json + *.safetensors)")


def test_not_a_gguf_and_truncated_gguf(tmp_path):
    fake = tmp_path / "fake.gguf"
    fake.write_text("hello, I am text")
    assert load_error(fake).startswith(f"{fake}: not a readable GGUF file (")
    hf_config = make_tiny_hf_config("llama")
    real = write_gguf_checkpoint(tmp_path / "real.gguf", hf_config, random_state_dict(hf_config))
    real.write_bytes(real.read_bytes()[: real.stat().st_size * 2 // 3])
    assert load_error(real).startswith(f"{real}: not a readable GGUF file (")


def test_gguf_with_unsupported_architecture(tmp_path):
    hf_config = make_tiny_hf_config("llama")
    path = write_gguf_checkpoint(tmp_path / "m.gguf", hf_config, random_state_dict(hf_config), architecture="gemma")
    assert load_error(path) == f"{path}: GGUF architecture 'gemma' is not supported (supported: llama, qwen2)"


def test_gguf_tensor_with_unsupported_quant_type(tmp_path):
    hf_config = make_tiny_hf_config("llama")
    state = random_state_dict(hf_config)
    path = write_gguf_checkpoint(tmp_path / "m.gguf", hf_config, state,
                                 tensor_qtypes={"model.layers.0.mlp.down_proj.weight": "IQ4_NL"})
    assert load_error(path).startswith(f"{path}: tensor blk.0.ffn_down.weight has type IQ4_NL, which specwise "
                                       "cannot read (readable: F32, F16, BF16, Q8_0, Q4_0, Q4_1, ")


def test_gguf_missing_tensor_is_named_as_in_the_file(tmp_path):
    hf_config = make_tiny_hf_config("llama")
    state = random_state_dict(hf_config)
    del state["model.layers.1.self_attn.k_proj.weight"]
    path = write_gguf_checkpoint(tmp_path / "m.gguf", hf_config, state)
    assert load_error(path) == f"{path}: missing tensor blk.1.attn_k.weight"


@pytest.mark.integration
@pytest.mark.slow
def test_default_model_weights_match_transformers_gguf_loader(real_model_path):
    transformers_gguf = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    from transformers import LlamaConfig, LlamaForCausalLM

    hf_config = transformers_gguf.load_gguf_checkpoint(real_model_path)["config"]
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(LlamaConfig(**hf_config))
    reference = transformers_gguf.load_gguf_checkpoint(real_model_path, return_tensors=True,
                                                       model_to_load=skeleton)["tensors"]
    checkpoint = load_checkpoint(real_model_path)
    assert set(checkpoint.weights) == set(reference)
    for name, tensor in checkpoint.weights.items():
        assert torch.equal(tensor, torch.as_tensor(reference[name]).float()), name
