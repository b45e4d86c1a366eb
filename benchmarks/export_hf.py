"""Write a checkpoint as a Hugging Face directory that vLLM (and transformers) can load.

    python benchmarks/export_hf.py OUT_DIR                 # the embedded default model (SmolLM2-135M-Instruct)
    python benchmarks/export_hf.py OUT_DIR --model PATH    # any checkpoint specwise loads (GGUF or HF dir)

Writes config.json, model.safetensors (HF parameter names, as specwise holds them after
dequantizing), tokenizer.json, tokenizer_config.json (with the chat template) and
generation_config.json. Used by benchmarks/vs_vllm.sh so both servers load the same files.
"""

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from specwise.models.loader import load_checkpoint

ARCHITECTURE_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def hf_config(config, dtype: torch.dtype) -> dict:
    eos = config.eos_token_ids
    return {
        "architectures": [ARCHITECTURE_CLASSES[config.architecture]],
        "model_type": config.architecture,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": config.rope_scaling,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.attention_bias,
        "mlp_bias": False,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else eos,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def tokenizer_config(tokenizer) -> dict:
    backend = tokenizer.backend
    special = {i: token for i, token in sorted(backend.get_added_tokens_decoder().items()) if token.special}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokenizer.bos_token or None,
        "eos_token": tokenizer.eos_token or None,
        "pad_token": tokenizer.eos_token or None,
        "unk_token": None,
        "add_bos_token": tokenizer.add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000,
        "additional_special_tokens": [t.content for t in special.values()
                                      if t.content not in (tokenizer.bos_token, tokenizer.eos_token)],
        "chat_template": tokenizer.chat_template,
    }


def export(out: Path, model: str | None, dtype: torch.dtype) -> None:
    checkpoint = load_checkpoint(model, dtype)
    out.mkdir(parents=True, exist_ok=True)
    weights = {name: tensor.to(dtype).contiguous() for name, tensor in checkpoint.weights.items()}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = checkpoint.config
    (out / "config.json").write_text(json.dumps(hf_config(config, dtype), indent=2) + "\n")
    generation = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_ids}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    checkpoint.tokenizer.backend.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(checkpoint.tokenizer), indent=2) + "\n")
    print(f"wrote {out} ({checkpoint.path.name}, {len(weights)} tensors, {dtype})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="directory to write")
    parser.add_argument("--model", default=None, help="checkpoint to export (default: the embedded default model)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="dtype of the saved weights (default: float32, the dequantized values unrounded)")
    args = parser.parse_args()
    export(args.out, args.model, getattr(torch, args.dtype))


if __name__ == "__main__":
    main()
