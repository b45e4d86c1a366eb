"""A draft model for `draft:DIR` made of a target's first layers, written as a Hugging Face directory.

No smaller model shares SmolLM2's tokenizer offline, so the integration test drafts with the
target's first L layers, final norm and LM head saved on their own (the untrained starting
point a distilled draft model would be trained from):

    write_first_layers_draft(load_checkpoint(None), 8, tmp_path / "draft")
"""

import json
from pathlib import Path

import safetensors.torch

from specwise.models.checkpoints.loader import Checkpoint


def hf_config(checkpoint: Checkpoint, num_layers: int) -> dict:
    config = checkpoint.config
    return {"model_type": config.architecture, "architectures": ["LlamaForCausalLM"],
            "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size, "num_hidden_layers": num_layers,
            "num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
            "head_dim": config.head_dim, "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta,
            "rope_scaling": config.rope_scaling, "max_position_embeddings": config.max_position_embeddings,
            "tie_word_embeddings": config.tie_word_embeddings, "attention_bias": config.attention_bias,
            "bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_ids, "torch_dtype": "float32"}


def write_first_layers_draft(checkpoint: Checkpoint, num_layers: int, directory: Path) -> Path:
    """config.json, model.safetensors (layers 0..num_layers-1 and the shared parts), tokenizer files."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf_config(checkpoint, num_layers), indent=2))
    kept = {name: tensor.float().contiguous() for name, tensor in checkpoint.weights.items()
            if not name.startswith("model.layers.") or int(name.split(".")[2]) < num_layers}
    safetensors.torch.save_file(kept, directory / "model.safetensors", metadata={"format": "pt"})
    tokenizer = checkpoint.tokenizer
    tokenizer.backend.save(str(directory / "tokenizer.json"))
    settings = {"bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token, "add_bos_token": tokenizer.add_bos,
                "chat_template": tokenizer.chat_template}
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    return directory
