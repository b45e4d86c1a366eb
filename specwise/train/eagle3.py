"""Training the EAGLE-3 head (models/heads/eagle3.py): token cross entropy only, with the unrolled
"training-time test" as for EAGLE (eagle.py) and noise on the fused residual streams.

Step 1 teacher-forces every pair t = (fc(a_t), embed(x_{t+1})) of a sequence at once, a_t the target's
residual streams after the head's three layers (data.py records them). Step j >= 2 feeds each chain's
own un-normed layer output back: chain t's pair at position t+j-1 is (r_{t+j-1}, embed(target's token
at t+j)), as the engine drafts once its earlier drafts were accepted. Every step's normed output goes
through the target's LM head (the tokens the target chooses in the data, as eagle.py) against the
target's greedy token; nothing regresses a feature, so what the layer feeds itself is its own choice.
"""

import copy
from pathlib import Path

import torch
import torch.nn.functional as F

from specwise.models.checkpoints.drafter import DrafterConfig, save_drafter
from specwise.models.heads.eagle3 import NUM_AUX_LAYERS, Eagle3Head
from specwise.models.llama import LlamaForCausalLM
from specwise.train.batch import Batch
from specwise.train.eagle import DraftingHead, EagleObjective, active_index
from specwise.train.unroll import LayerState, layer_step, rope


class Eagle3Objective(EagleObjective):
    needs_features = True

    def __init__(self, target: LlamaForCausalLM, signature: dict, active_vocab: torch.Tensor, aux_layers: list[int],
                 *, unroll: int = 1, feature_noise: float = 0.0):
        config = target.config
        self.module = Eagle3Head(config).float()
        self.aux_layers = aux_layers
        self.embedding = target.embed_tokens.weight.detach().float()           # [vocab, hidden], frozen
        self.lm_head = target.lm_head.weight.detach().float()                  # [vocab, hidden], frozen
        self.active_vocab = active_vocab                                       # [A] token ids
        self.active_index = active_index(active_vocab, config.vocab_size)    # [vocab] -> label or -1
        self.active_head = self.lm_head[active_vocab]                          # [A, hidden]
        self.drafting_head = DraftingHead(self.lm_head)
        self.signature = signature
        self.unroll, self.feature_noise, self.feature_weight = unroll, feature_noise, 0.0

    def steps(self, batch: Batch, num_steps: int, tokens_for_step, noise: torch.Generator | None = None,
              first_chain: int = 0):
        """As EagleObjective.steps: (step j, first chain, normed outputs [B, C, hidden]) per step."""
        head = self.module
        layer = head.layer
        aux = batch.aux[:, :-1]                                               # a_0 .. a_{L-2}, [B, L-1, 3H]
        if noise is not None and self.feature_noise > 0:                      # relative to each layer's RMS
            streams = aux.unflatten(-1, (NUM_AUX_LAYERS, -1))
            scale = self.feature_noise * streams.pow(2).mean(dim=(0, 1, 3), keepdim=True).sqrt()
            aux = (streams + scale * torch.randn(streams.shape, generator=noise)).flatten(-2)
        hidden = head.fuse(aux)
        tokens = batch.token_ids[:, 1:]                                       # x_1 .. x_{L-1}
        positions = torch.arange(tokens.shape[1]).expand(len(tokens), -1)
        state = LayerState()
        first = 0
        for step in range(1, num_steps + 1):
            if step == 2:
                state.first_chain = first = first_chain
                hidden, positions = fed[:, first:], positions[:, first:]
            elif step > 2:
                hidden = fed
            if step > 1:
                tokens = tokens_for_step(step, first, hidden.shape[1])
            attention_input = layer.attention_input(hidden, F.embedding(tokens, self.embedding))
            fed = layer_step(layer, hidden, rope(head.rotary, positions + step - 1, hidden.dtype), state,
                             attention_input)
            yield step, first, head.norm(fed)

    def export(self, out: Path, card: str, training: dict) -> None:
        shipped = copy.deepcopy(self.module).to(torch.bfloat16)            # half the bytes; the engine casts
        drafter = DrafterConfig("eagle3", self.signature, training=training, draft_vocab=self.active_vocab.tolist(),
                                aux_layers=list(self.aux_layers))
        save_drafter(out, shipped, drafter, card)
