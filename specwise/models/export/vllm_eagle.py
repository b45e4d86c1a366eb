"""An EAGLE head in vLLM's checkpoint format (`--speculative-config '{"method": "eagle", "model": DIR}'`),
written and read back. Facts from vLLM 0.32.0's source (model_executor/models/mistral_eagle.py,
llama_eagle.py, transformers_utils/configs/eagle.py, v1/spec_decode/llm_base_proposer.py):

- vLLM names the draft's class "Eagle" + the architecture in config.json. Its EAGLE-1 Llama class
  (EagleLlamaForCausalLM) runs layer 0 without an input norm and has no final norm; the Mistral one
  (EagleMistralForCausalLM) keeps both, as our head does: fc -> a Llama decoder layer (input norm,
  attention, post-attention norm, SiLU MLP) -> final RMSNorm, whose output is both what the LM head
  reads and the feature fed back for the next draft. So our head is written as EagleMistralForCausalLM
  (model_type "mistral", sliding_window null: transformers' Mistral default is a 4096-token window).
- fc reads [embedding ; feature] (ours: [feature ; embedding]): its two column halves swap.
- Weight names: model.fc.weight, model.layers.0.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_
  layernorm, mlp.{gate,up,down}_proj}.weight, model.norm.weight; no embedding and no LM head, which
  vLLM then shares from the target (so neither may be in the file, or the draft keeps its own copy).
- No draft vocabulary: the EAGLE (non-EAGLE-3) path drafts over the target's whole LM head.

The features vLLM passes are the target's final-normed hidden states, ours too.
"""

from pathlib import Path

import torch
import torch.nn.functional as F

from specwise.errors import ModelLoadError
from specwise.models.config import ModelConfig
from specwise.models.export.hf_writer import check_weight_shapes, read_checkpoint, split_fused, write_checkpoint
from specwise.models.heads.eagle import EagleHead
from specwise.models.rope import inverse_frequencies

ARCHITECTURE = "EagleMistralForCausalLM"
MODEL_TYPE = "mistral"
LAYER = "model.layers.0."
LAYER_WEIGHTS = ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def eagle_config(target: ModelConfig, dtype: torch.dtype) -> dict:
    """config.json: one decoder layer of the target's shapes, the target's rope and norm epsilon."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "hidden_size": target.hidden_size,
        "intermediate_size": target.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": target.num_attention_heads,
        "num_key_value_heads": target.num_key_value_heads,
        "head_dim": target.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": target.rms_norm_eps,
        "rope_theta": target.rope_theta,
        "rope_scaling": target.rope_scaling,
        "max_position_embeddings": target.max_position_embeddings,
        "sliding_window": None,
        "attention_bias": target.attention_bias,
        "vocab_size": target.vocab_size,
        "tie_word_embeddings": False,
        "bos_token_id": target.bos_token_id,
        "eos_token_id": target.eos_token_ids[0] if len(target.eos_token_ids) == 1 else target.eos_token_ids,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def eagle_weights(head: EagleHead) -> dict[str, torch.Tensor]:
    """Our head's parameters under vLLM's names and layouts."""
    config = head.config
    hidden = config.hidden_size
    fc = head.fc.weight.detach()                                   # [hidden, 2 * hidden]: [feature ; embedding]
    weights = {"model.fc.weight": torch.cat([fc[:, hidden:], fc[:, :hidden]], dim=1),
               "model.norm.weight": head.norm.weight.detach()}
    for name, tensor in head.layer.state_dict().items():
        for part_name, part in split_fused(name, tensor.detach(), config).items():
            weights[LAYER + part_name] = part
    if config.attention_bias:          # vLLM's Llama layer gives o_proj a bias whenever q/k/v have one; ours is 0
        weights[LAYER + "self_attn.o_proj.bias"] = torch.zeros(hidden)
    return weights


def write_eagle(out: Path, head: EagleHead, dtype: torch.dtype) -> None:
    write_checkpoint(out, eagle_weights(head), eagle_config(head.config, dtype), dtype)


def read_eagle(directory: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """config.json and the weights of an exported head, checked as vLLM's loader would need them."""
    directory = Path(directory)
    config, weights = read_head(directory, "vLLM EAGLE", ARCHITECTURE, MODEL_TYPE)
    hidden = config["hidden_size"]
    shapes = {"model.fc.weight": (hidden, 2 * hidden), "model.norm.weight": (hidden,)}
    check_weight_shapes(directory, weights, shapes | decoder_layer_shapes(config, LAYER, hidden))
    return config, weights


def read_head(directory: Path, what: str, architecture: str, model_type: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, the weights) of an exported head whose config names this architecture and model type."""
    config, weights = read_checkpoint(directory, what)
    if config.get("architectures") != [architecture] or config.get("model_type") != model_type:
        raise ModelLoadError(directory, f"config.json names {config.get('architectures')}, not [{architecture!r}]")
    return config, weights


def decoder_layer_shapes(config: dict, prefix: str, attention_input: int) -> dict[str, tuple]:
    """One Llama decoder layer's weight shapes as vLLM loads them: its attention reads rows of
    `attention_input` (the hidden size; EAGLE-3's midlayer reads [embedding ; feature], twice it), its MLP
    rows of the hidden size; q/k/v/o biases too where the config has attention_bias."""
    hidden, heads, kv_heads, head_dim = (config["hidden_size"], config["num_attention_heads"],
                                         config["num_key_value_heads"], config["head_dim"])
    inter = config["intermediate_size"]
    shapes = {prefix + "input_layernorm.weight": (hidden,), prefix + "post_attention_layernorm.weight": (hidden,),
              prefix + "self_attn.q_proj.weight": (heads * head_dim, attention_input),
              prefix + "self_attn.k_proj.weight": (kv_heads * head_dim, attention_input),
              prefix + "self_attn.v_proj.weight": (kv_heads * head_dim, attention_input),
              prefix + "self_attn.o_proj.weight": (hidden, heads * head_dim),
              prefix + "mlp.gate_proj.weight": (inter, hidden), prefix + "mlp.up_proj.weight": (inter, hidden),
              prefix + "mlp.down_proj.weight": (hidden, inter)}
    if config.get("attention_bias"):
        shapes.update({prefix + f"self_attn.{p}_proj.bias": (shapes[prefix + f"self_attn.{p}_proj.weight"][0],)
                       for p in "qkvo"})
    return shapes


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def linear(w: dict[str, torch.Tensor], x: torch.Tensor, name: str) -> torch.Tensor:
    return F.linear(x, w[name + ".weight"], w.get(name + ".bias"))


def attention_rows(config: dict, w: dict[str, torch.Tensor], prefix: str, x: torch.Tensor,
                   positions: torch.Tensor) -> torch.Tensor:
    """A Llama layer's attention as vLLM runs it, causal over the n rows of one sequence, fp32: its
    input x [n, width] at positions [n] -> o_proj's output [n, hidden] (prefix: "model.layers.0." ...)."""
    head_dim, heads, kv_heads = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]
    n = x.shape[0]
    q = linear(w, x, prefix + "self_attn.q_proj").view(n, heads, head_dim)
    k = linear(w, x, prefix + "self_attn.k_proj").view(n, kv_heads, head_dim)
    v = linear(w, x, prefix + "self_attn.v_proj").view(n, kv_heads, head_dim)
    inv_freq = inverse_frequencies(head_dim, config["rope_theta"], config.get("rope_scaling")).float()
    angles = positions.double().unsqueeze(-1).float() * inv_freq                  # [n, head_dim / 2]
    cos, sin = torch.cat([angles, angles], -1).cos()[:, None], torch.cat([angles, angles], -1).sin()[:, None]

    def rotate(t):                                                                 # neox / "rotate half" layout
        first, second = t.chunk(2, dim=-1)
        return t * cos + torch.cat([-second, first], dim=-1) * sin

    q, k = rotate(q), rotate(k)
    k, v = k.repeat_interleave(heads // kv_heads, dim=1), v.repeat_interleave(heads // kv_heads, dim=1)
    attn = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    return linear(w, attn.transpose(0, 1).reshape(n, heads * head_dim), prefix + "self_attn.o_proj")


def mlp_rows(w: dict[str, torch.Tensor], prefix: str, x: torch.Tensor) -> torch.Tensor:
    return linear(w, F.silu(linear(w, x, prefix + "mlp.gate_proj")) * linear(w, x, prefix + "mlp.up_proj"),
                  prefix + "mlp.down_proj")


def exported_eagle_forward(config: dict, weights: dict[str, torch.Tensor], features: torch.Tensor,
                           embeddings: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """What vLLM's EagleMistralForCausalLM computes for one sequence, from the files alone, in fp32:
    embeddings of x_{t+1} and target features f_t [n, hidden] at positions t [n] (causal over the n rows)
    -> the draft's hidden states [n, hidden], which the target's LM head turns into draft logits."""
    w = {name: tensor.float() for name, tensor in weights.items()}
    eps = config["rms_norm_eps"]
    x = linear(w, torch.cat([embeddings.float(), features.float()], dim=-1), "model.fc")
    x = x + attention_rows(config, w, LAYER, rms_norm(x, w[LAYER + "input_layernorm.weight"], eps), positions)
    x = x + mlp_rows(w, LAYER, rms_norm(x, w[LAYER + "post_attention_layernorm.weight"], eps))
    return rms_norm(x, w["model.norm.weight"], eps)
