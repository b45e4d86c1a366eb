"""Training the EAGLE head (models/heads/eagle.py): token cross entropy plus feature regression, with
an optional unrolled "training-time test" and noise on the input features.

Pairing, as the engine drafts (see models/heads/eagle.py): pair t = (f_t, embed(x_{t+1})) at position t
predicts f̂_{t+1}, whose LM-head argmax drafts token t+2. Step 1 teacher-forces every pair of a
sequence at once. Step j >= 2 (`--unroll`) feeds each chain's predicted feature back: chain t's
pair at position t+j-1 is (f̂_{t+j-1}, embed(target's token at t+j)), the context the head has
when its earlier drafts were accepted, and it predicts f̂_{t+j}.

Loss at every step and position: CE(lm_head(f̂_p), target's greedy token after p) +
feature_weight * smooth_l1(f̂_p, f_p). The cross entropy runs over the tokens that ever occur
as the target's choice in the training data (a few thousand of the vocabulary; much cheaper than
the full LM head and the same argmax on the data); the held-out acceptance uses the full head.
"""

import copy
from pathlib import Path

import torch
import torch.nn.functional as F

from specwise.models.capabilities import compute_dtype
from specwise.models.checkpoints.drafter import DrafterConfig, save_drafter
from specwise.models.heads.eagle import EagleHead
from specwise.models.llama import LlamaForCausalLM
from specwise.models.quantize import bf16_linear
from specwise.train.batch import Batch
from specwise.train.unroll import LayerState, layer_step, rope


class EagleObjective:
    needs_features = True

    def __init__(self, target: LlamaForCausalLM, signature: dict, active_vocab: torch.Tensor, *,
                 unroll: int = 1, feature_noise: float = 0.0, feature_weight: float = 1.0,
                 init_from_target: bool = True):
        config = target.config
        self.module = EagleHead(config).float()
        if init_from_target:
            # the last decoder layer already maps the residual stream to what the final norm reads
            self.module.layer.load_state_dict({k: v.float() for k, v in target.layers[-1].state_dict().items()})
            self.module.norm.weight.data.copy_(target.norm.weight.float())
        self.embedding = target.embed_tokens.weight.detach().float()           # [vocab, hidden], frozen
        self.lm_head = target.lm_head.weight.detach().float()                  # [vocab, hidden], frozen
        self.active_vocab = active_vocab                                       # [A] token ids
        self.active_index = active_index(active_vocab, config.vocab_size)    # [vocab] -> label or -1
        self.active_head = self.lm_head[active_vocab]                          # [A, hidden]
        self.drafting_head = DraftingHead(self.lm_head)
        self.signature = signature
        self.unroll, self.feature_noise, self.feature_weight = unroll, feature_noise, feature_weight

    def steps(self, batch: Batch, num_steps: int, tokens_for_step, noise: torch.Generator | None = None,
              first_chain: int = 0):
        """Yield (step j, first chain, predicted features [B, C, hidden]): row c is chain first + c, and
        its step-j feature predicts position first + c + j. Step 1 runs every chain (first = 0); later
        steps run chains first_chain.. only. tokens_for_step(j, first_chain, count) -> [B, count] token
        ids of the pairs at step j >= 2."""
        head = self.module
        features = batch.features[:, :-1]                                     # f_0 .. f_{L-2}
        if noise is not None and self.feature_noise > 0:
            scale = self.feature_noise * features.pow(2).mean().sqrt()
            features = features + scale * torch.randn(features.shape, generator=noise)
        tokens = batch.token_ids[:, 1:]                                       # x_1 .. x_{L-1}
        positions = torch.arange(tokens.shape[1]).expand(len(tokens), -1)
        state = LayerState()
        first = 0
        for step in range(1, num_steps + 1):
            if step == 2:
                state.first_chain = first = first_chain
                features, positions = predicted[:, first:], positions[:, first:]
            elif step > 2:
                features = predicted
            if step > 1:
                tokens = tokens_for_step(step, first, features.shape[1])
            hidden = head.fc(torch.cat([features, F.embedding(tokens, self.embedding)], dim=-1))
            hidden = layer_step(head.layer, hidden, rope(head.rotary, positions + step - 1, hidden.dtype), state)
            predicted = head.norm(hidden)
            yield step, first, predicted

    def loss(self, batch: Batch, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        total, parts = 0.0, {}
        teacher = lambda step, first, count: batch.shifted("target_next", first + step - 1, count)   # noqa: E731
        first_chain = max(int(batch.response_start.min()) - 1, 0)
        for step, first, predicted in self.steps(batch, self.unroll, teacher, generator, first_chain):
            count = predicted.shape[1]
            valid = batch.valid(count, offset=first + step)                   # position first + c + step exists
            labels = self.active_index[batch.shifted("target_next", first + step, count)[valid]]
            logits = predicted[valid] @ self.active_head.T                     # [rows, A]
            ce = F.cross_entropy(logits, labels)
            total = total + ce
            if self.feature_weight:                     # EAGLE-3 (eagle3.py) regresses no feature
                target = batch.shifted("features", first + step, count)[valid]
                total = total + self.feature_weight * F.smooth_l1_loss(predicted[valid], target)
            parts[f"ce{step}"] = ce.item()
            parts[f"top1_{step}"] = (logits.argmax(-1) == labels).float().mean().item()
        return total / self.unroll, parts

    @torch.no_grad()
    def chain_drafts(self, batch: Batch, k: int, first_chain: int = 0) -> torch.Tensor:
        drafts = []
        for step, _, predicted in self.steps(batch, k, lambda *_: drafts[-1], first_chain=first_chain):
            if step == 1:
                predicted = predicted[:, first_chain:]
            drafts.append(self.drafting_head(predicted))                       # [1, C - first_chain]
        return torch.stack(drafts, dim=-1)[0]                                  # [C - first_chain, k]

    def export(self, out: Path, card: str, training: dict) -> None:
        shipped = copy.deepcopy(self.module).to(torch.bfloat16)            # half the bytes; the engine casts
        # draft_vocab: the tokens it was trained to predict; the engine drafts through just those LM-head rows
        drafter = DrafterConfig("eagle", self.signature, training=training, draft_vocab=self.active_vocab.tolist())
        save_drafter(out, shipped, drafter, card)


def active_index(active_vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[vocab_size]: each token id's position in active_vocab (its class in the loss), -1 if absent."""
    index = torch.full((vocab_size,), -1, dtype=torch.long)
    index[active_vocab] = torch.arange(len(active_vocab))
    return index


def active_vocabulary(target_next: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Sorted token ids the target chose anywhere in the data."""
    present = torch.zeros(vocab_size, dtype=torch.bool)
    present[target_next.long()] = True
    return present.nonzero().squeeze(1)


class DraftingHead:
    """The full LM head as the engine runs it where it drafts: bf16 (quantize.py's fastest path) on a
    CPU with native bf16, else fp32. features [..., hidden] -> argmax token ids [...]."""

    def __init__(self, lm_head: torch.Tensor):
        self.dtype = compute_dtype("auto", "cpu")
        self.linear = bf16_linear(lm_head) if self.dtype == torch.bfloat16 else None
        self.weight = lm_head

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        if self.linear is None:
            return (features.float() @ self.weight.T).argmax(-1)
        return self.linear(features.to(torch.bfloat16)).argmax(-1)
