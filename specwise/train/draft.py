"""Distilling a small draft model: a few of the target's decoder layers (spread from the first to
the last), its embedding, final norm and LM head, trained on the target's greedy tokens.

The result is an ordinary model with the target's tokenizer, written as a Hugging Face directory
(config.json, model.safetensors, tokenizer files) that `--speculative draft:DIR` loads. Loss:
cross entropy of the draft's logits at every position against the target's greedy token there,
over the tokens the target ever chooses in the data (see eagle.py).
"""

import copy
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from specwise.models.export.hf_writer import hf_weights, write_hf_dir
from specwise.models.llama import LlamaForCausalLM
from specwise.models.tokenizer import Tokenizer
from specwise.train.batch import Batch
from specwise.train.eagle import DraftingHead, active_index
from specwise.train.unroll import LayerState, layer_step, rope


def spread_layers(num_target_layers: int, num_layers: int) -> list[int]:
    """Evenly spaced layer indices, first and last included: 30 layers, 4 kept -> [0, 10, 19, 29]."""
    if num_layers == 1:
        return [num_target_layers - 1]
    return sorted({round(i * (num_target_layers - 1) / (num_layers - 1)) for i in range(num_layers)})


class DraftObjective:
    needs_features = False

    def __init__(self, target: LlamaForCausalLM, tokenizer: Tokenizer, active_vocab: torch.Tensor, num_layers: int):
        kept = spread_layers(target.config.num_hidden_layers, min(num_layers, target.config.num_hidden_layers))
        config = copy.deepcopy(target.config)
        config.num_hidden_layers = len(kept)
        model = LlamaForCausalLM(config, target.rotary.cos.shape[0])
        state = {name: tensor.float() for name, tensor in target.state_dict().items() if not name.startswith("layers.")}
        for index, source in enumerate(kept):
            state.update({f"layers.{index}.{name}": tensor.float()
                          for name, tensor in target.layers[source].state_dict().items()})
        model.load_state_dict(state, strict=False)
        self.module = model.float()
        self.module.rotary = target.rotary                                        # fp32 tables, not trained
        self.tokenizer, self.kept_layers = tokenizer, kept
        self.active_vocab = active_vocab
        self.active_index = active_index(active_vocab, config.vocab_size)    # [vocab] -> label or -1

    def steps(self, batch: Batch, num_steps: int, tokens_for_step, first_chain: int = 0):
        """Yield (step j, hidden [B, C, hidden]): step 1 runs every position; from step 2 row c is the
        chain at position first_chain + c, its step-j output at position first_chain + c + j - 1.
        tokens_for_step(j) -> [B, C] token ids fed at step j >= 2."""
        model = self.module
        tokens = batch.token_ids
        positions = torch.arange(tokens.shape[1]).expand_as(tokens)
        states = [LayerState() for _ in model.layers]
        for step in range(1, num_steps + 1):
            if step == 2:
                positions = positions[:, first_chain:]
                for state in states:
                    state.first_chain = first_chain
            if step > 1:
                tokens = tokens_for_step(step)
            hidden = model.embed_tokens(tokens)
            cos_sin = rope(model.rotary, positions + step - 1, hidden.dtype)
            for layer, state in zip(model.layers, states):
                hidden = layer_step(layer, hidden, cos_sin, state)
            hidden = model.norm(hidden)
            yield step, hidden

    def loss(self, batch: Batch, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        length = batch.token_ids.shape[1]
        _, hidden = next(self.steps(batch, 1, None))
        valid = batch.valid(length)
        labels = self.active_index[batch.target_next[valid]]
        logits = hidden[valid] @ self.module.lm_head.weight[self.active_vocab].T
        ce = F.cross_entropy(logits, labels)
        return ce, {"ce": ce.item(), "top1": (logits.argmax(-1) == labels).float().mean().item()}

    @torch.no_grad()
    def chain_drafts(self, batch: Batch, k: int, first_chain: int = 0) -> torch.Tensor:
        # chain t (the target just emitted token t + 1) is the draft model's chain at position t + 1
        drafts = []
        for step, hidden in self.steps(batch, k, lambda _: drafts[-1], first_chain + 1):
            if step == 1:
                hidden = hidden[:, first_chain + 1:]
            drafts.append(DraftingHead(self.module.lm_head.weight.detach())(hidden))   # [1, L - 1 - first_chain]
        return torch.stack(drafts, dim=-1)[0]                                   # [L - 1 - first_chain, k]

    def export(self, out: Path, card: str, training: dict) -> None:
        write_hf_dir(out, self.module.config, hf_weights(self.module), self.tokenizer, torch.bfloat16)
        (out / "README.md").write_text(card)
        (out / "training.json").write_text(json.dumps(training, indent=1) + "\n")
