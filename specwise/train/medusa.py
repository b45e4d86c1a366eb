"""Training Medusa heads (models/heads/medusa.py): head i on feature f_t learns the target's token t+2+i.

Worked example: the target emitted x_4 from f_3; head 0 on f_3 drafts x_5 (the target's greedy
token after position 4, target_next[4]), head 1 drafts x_6 (target_next[5]), and so on. The loss
is the mean over heads of the cross entropy against those tokens, over the tokens the target
ever chooses in the data (see eagle.py); the held-out acceptance uses the full LM head.
"""

import copy
from pathlib import Path

import torch
import torch.nn.functional as F

from specwise.models.checkpoints.drafter import DrafterConfig, save_drafter
from specwise.models.heads.medusa import MedusaHeads
from specwise.models.llama import LlamaForCausalLM
from specwise.train.batch import Batch
from specwise.train.eagle import DraftingHead, active_index


class MedusaObjective:
    needs_features = True

    def __init__(self, target: LlamaForCausalLM, signature: dict, active_vocab: torch.Tensor, num_heads: int):
        config = target.config
        self.module = MedusaHeads(config.hidden_size, num_heads).float()
        self.lm_head = target.lm_head.weight.detach().float()                  # [vocab, hidden], frozen
        self.active_vocab = active_vocab                                       # [A] token ids
        self.active_index = active_index(active_vocab, config.vocab_size)    # [vocab] -> label or -1
        self.active_head = self.lm_head[active_vocab]                          # [A, hidden]
        self.drafting_head = DraftingHead(self.lm_head)
        self.signature, self.num_heads = signature, num_heads

    def loss(self, batch: Batch, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        chains = batch.token_ids.shape[1] - 1
        predicted = self.module(batch.features[:, :-1].reshape(-1, batch.features.shape[-1]))
        predicted = predicted.view(len(batch.lengths), chains, self.num_heads, -1)   # [B, C, heads, hidden]
        total, parts = 0.0, {}
        for head in range(self.num_heads):
            valid = batch.valid(chains, offset=head + 1)                       # position t + 1 + head exists
            labels = self.active_index[batch.shifted("target_next", head + 1, chains)[valid]]
            logits = predicted[:, :, head][valid] @ self.active_head.T
            ce = F.cross_entropy(logits, labels)
            total = total + ce
            parts[f"ce{head}"] = ce.item()
        return total / self.num_heads, parts

    @torch.no_grad()
    def chain_drafts(self, batch: Batch, k: int, first_chain: int = 0) -> torch.Tensor:
        predicted = self.module(batch.features[0, first_chain:-1])              # [C - first_chain, heads, hidden]
        return self.drafting_head(predicted[:, :k])                             # [C - first_chain, k]

    def export(self, out: Path, card: str, training: dict) -> None:
        # draft_vocab: the tokens it was trained to predict; the engine drafts through just those LM-head rows
        drafter = DrafterConfig("medusa", self.signature, num_heads=self.num_heads, training=training,
                                draft_vocab=self.active_vocab.tolist())
        save_drafter(out, copy.deepcopy(self.module).to(torch.bfloat16), drafter, card)   # the engine casts
