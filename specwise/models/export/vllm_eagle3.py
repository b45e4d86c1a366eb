"""An EAGLE-3 head in vLLM's checkpoint format (`--speculative-config '{"method": "eagle3", "model": DIR}'`),
written and read back. Facts from vLLM 0.32.0's source (model_executor/models/llama_eagle3.py, llama.py,
interfaces.py, transformers_utils/configs/eagle.py, v1/spec_decode/llm_base_proposer.py):

- config.json: a Llama config (model_type "llama"), architectures ["Eagle3LlamaForCausalLM"], one hidden
  layer of the target's shapes; eagle_aux_hidden_state_layer_ids: the target layers whose residual
  streams are fused (vLLM's layer id L: the stream after L decoder layers, 0 the embeddings, as ours);
  draft_vocab_size: rows of the draft's own LM head. Left at vLLM's defaults: norm_before_fc,
  fc_norm, norm_before_residual, norm_output (all false), which is our head: the residual is the fed
  hidden itself, and the un-normed output is what is fed back.
- Weights: fc.weight [H, 3H] over the streams in ascending layer order (vLLM concatenates them as it
  collects them, so the ids must be distinct); midlayer.{input_layernorm (on the embeddings),
  hidden_norm, self_attn.{q,k,v}_proj [., 2H] reading [embedding ; hidden], self_attn.o_proj,
  post_attention_layernorm, mlp.{gate,up,down}_proj}.weight; norm.weight; lm_head.weight
  [draft_vocab_size, H]; d2t [draft_vocab_size] int64, draft id i drafts target token i + d2t[i]. No
  embedding: vLLM then shares the target's.
- Unlike the EAGLE path, the draft vocabulary is kept: lm_head holds the target's LM-head rows of our
  draft_vocab and d2t maps them back (every other token gets no draft probability, as in our engine).
"""

from pathlib import Path

import torch

from specwise.errors import ModelLoadError
from specwise.models.config import ModelConfig
from specwise.models.export.hf_writer import check_weight_shapes, split_fused, write_checkpoint
from specwise.models.export.vllm_eagle import (attention_rows, decoder_layer_shapes, linear, mlp_rows, read_head,
                                               rms_norm)
from specwise.models.heads.eagle3 import Eagle3Head

ARCHITECTURE = "Eagle3LlamaForCausalLM"
MODEL_TYPE = "llama"
LAYER = "midlayer."


def eagle3_config(target: ModelConfig, aux_layers: list[int], draft_vocab_size: int, dtype: torch.dtype) -> dict:
    return {
        "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE,
        "hidden_size": target.hidden_size, "intermediate_size": target.intermediate_size, "num_hidden_layers": 1,
        "num_attention_heads": target.num_attention_heads, "num_key_value_heads": target.num_key_value_heads,
        "head_dim": target.head_dim, "hidden_act": "silu", "rms_norm_eps": target.rms_norm_eps,
        "rope_theta": target.rope_theta, "rope_scaling": target.rope_scaling,
        "max_position_embeddings": target.max_position_embeddings, "attention_bias": target.attention_bias,
        "mlp_bias": False, "vocab_size": target.vocab_size, "draft_vocab_size": draft_vocab_size,
        "target_hidden_size": target.hidden_size, "eagle_aux_hidden_state_layer_ids": list(aux_layers),
        "tie_word_embeddings": False, "bos_token_id": target.bos_token_id,
        "eos_token_id": target.eos_token_ids[0] if len(target.eos_token_ids) == 1 else target.eos_token_ids,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def eagle3_weights(head: Eagle3Head, lm_head: torch.Tensor, draft_vocab: list[int] | None) -> dict[str, torch.Tensor]:
    """Our head's parameters under vLLM's names; lm_head: the target's LM head [vocab, H], cut to draft_vocab."""
    config = head.config
    weights = {"fc.weight": head.fc.weight.detach(), "norm.weight": head.norm.weight.detach()}
    for name, tensor in head.layer.state_dict().items():
        for part_name, part in split_fused(name, tensor.detach(), config).items():
            weights[LAYER + part_name] = part
    if config.attention_bias:          # vLLM's Llama layer gives o_proj a bias whenever q/k/v have one; ours is 0
        weights[LAYER + "self_attn.o_proj.bias"] = torch.zeros(config.hidden_size)
    ids = torch.arange(lm_head.shape[0]) if draft_vocab is None else torch.tensor(draft_vocab)
    weights["lm_head.weight"] = lm_head.detach()[ids]
    weights["d2t"] = ids - torch.arange(len(ids))
    return weights


def write_eagle3(out: Path, head: Eagle3Head, aux_layers: list[int], lm_head: torch.Tensor,
                 draft_vocab: list[int] | None, dtype: torch.dtype) -> None:
    weights = eagle3_weights(head, lm_head, draft_vocab)
    # d2t stays int64; the LM-head rows keep the target's dtype, so the draft's logits are the target's own
    exact = {name: weights.pop(name) for name in ("d2t", "lm_head.weight")}
    write_checkpoint(out, weights, eagle3_config(head.config, aux_layers, len(exact["d2t"]), dtype), dtype, exact)


def read_eagle3(directory: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """config.json and the weights of an exported head, checked as vLLM's loader would need them."""
    directory = Path(directory)
    config, weights = read_head(directory, "vLLM EAGLE-3", ARCHITECTURE, MODEL_TYPE)
    hidden, layers, draft = config["hidden_size"], config["eagle_aux_hidden_state_layer_ids"], \
        config["draft_vocab_size"]
    if layers != sorted(set(layers)):
        raise ModelLoadError(directory, f"eagle_aux_hidden_state_layer_ids {layers} are not distinct and ascending")
    shapes = {"fc.weight": (hidden, len(layers) * hidden), "norm.weight": (hidden,),
              "lm_head.weight": (draft, hidden), "d2t": (draft,), LAYER + "hidden_norm.weight": (hidden,)}
    # the midlayer's attention reads [normed embedding ; normed feature]
    check_weight_shapes(directory, weights, shapes | decoder_layer_shapes(config, LAYER, 2 * hidden))
    if weights["d2t"].dtype != torch.int64:
        raise ModelLoadError(directory, f"d2t is {weights['d2t'].dtype}, vLLM adds it to int64 ids")
    return config, weights


def exported_eagle3_forward(config: dict, weights: dict[str, torch.Tensor], hidden: torch.Tensor,
                            embeddings: torch.Tensor, positions: torch.Tensor,
                            fuse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """What vLLM's Eagle3LlamaForCausalLM computes for one sequence, from the files alone, in fp32: hidden
    [n, 3H] (the target's streams; fuse: fc first) or [n, H] (fed back), embeddings of the next tokens
    [n, H] at positions [n], causal over the n rows -> (draft logits [n, vocab], -inf off the draft
    vocabulary; the un-normed output fed back, [n, H])."""
    w = {name: tensor.float() for name, tensor in weights.items() if name != "d2t"}
    eps = config["rms_norm_eps"]
    if fuse:
        hidden = linear(w, hidden.float(), "fc")
    x = torch.cat([rms_norm(embeddings.float(), w[LAYER + "input_layernorm.weight"], eps),
                   rms_norm(hidden, w[LAYER + "hidden_norm.weight"], eps)], dim=-1)
    out = hidden + attention_rows(config, w, LAYER, x, positions)
    out = out + mlp_rows(w, LAYER, rms_norm(out, w[LAYER + "post_attention_layernorm.weight"], eps))
    draft_logits = rms_norm(out, w["norm.weight"], eps) @ w["lm_head.weight"].T                # [n, draft_vocab]
    targets = torch.arange(config["draft_vocab_size"]) + weights["d2t"]
    logits = torch.full((len(out), config["vocab_size"]), float("-inf"))
    logits[:, targets] = draft_logits
    return logits, out
