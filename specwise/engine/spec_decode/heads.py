"""What an `eagle[:DIR]` / `medusa[:DIR]` drafter runs: its head, from DIR or the built-in one for the
target, and the LM head its predicted features draft through.

Shared by eagle.py and medusa.py: a directory of another kind, or no built-in head for this
target, is a one-line ConfigError that says what to do instead.

The LM head is the target's own module, unless the head's drafter.json lists a draft
vocabulary (the tokens it was trained to draft, a few thousand of ~50k): then a copy of just
those rows of the target's LM head, A x hidden, computes the draft logits, a fraction of the
full head's cost (the full head is ~12% of a SmolLM2-135M decode step, per draft token). Every
other token gets a logit far below the lowest of those rows, so its draft probability is 0
(lossless: the verifier's residual samples it when the target wants it), yet stays finite so
a grammar that allows none of the draft vocabulary still leaves a distribution to sample.

Worked example: draft vocabulary [3, 7], row logits 2.0 and -1.0 there -> logits over the
vocabulary [.., -10001.0 at every other id, 2.0 at 3, -1.0 at 7]: softmax puts e^2 / (e^2 +
e^-1) = 0.95 on token 3, 0.05 on 7, exactly 0 elsewhere.
"""

from pathlib import Path

import torch
from torch import nn

from specwise.engine.spec_decode.context import ProposerContext
from specwise.errors import ConfigError
from specwise.models.checkpoints.drafter import DrafterConfig, load_drafter
from specwise.models.heads.builtin import find_builtin_head
from specwise.models.llama import LlamaForCausalLM
from specwise.models.quantize import pack_weights

OUTSIDE_MARGIN = 1e4        # how far below the draft vocabulary's lowest logit every other token sits


def load_head(kind: str, directory: str | None, context: ProposerContext) -> tuple[Path, DrafterConfig, nn.Module]:
    """(the directory used, its config, the head in the target's compute dtype, ready to run)."""
    target = context.runner.model.config
    if directory is None:
        found = find_builtin_head(kind, target, context.tokenizer)
        if found is None:
            raise ConfigError(
                f"no built-in {kind} head for this target (hidden_size {target.hidden_size}, vocab_size "
                f"{target.vocab_size}, {target.num_hidden_layers} layers, its tokenizer); train one with "
                f"`specwise train-drafter --kind {kind} --target MODEL --out DIR` and use --speculative {kind}:DIR")
        directory = found
    path = Path(directory).expanduser()
    drafter, head = load_drafter(path, target, context.tokenizer, context.dtype, context.device,
                                 context.max_model_len)
    if drafter.kind != kind:
        raise ConfigError(f"{path}: holds a {drafter.kind!r} head, not {kind!r}; use --speculative "
                          f"{drafter.kind}:{directory}")
    return path, drafter, pack_weights(head, context.dtype, "none", context.device)


class DraftLMHead:
    """features [rows, hidden] -> draft logits [rows, vocab] fp32, through the target's LM head or the
    rows of its draft vocabulary (see the module docstring)."""

    def __init__(self, model: LlamaForCausalLM, draft_vocab: list[int] | None, context: ProposerContext):
        self.model = model
        # the target's LM head as its runner runs it (under --compile: the compiled head's graphs, from the
        # step a server switches to them on)
        self.full_logits = context.runner.compute_logits
        self.draft_vocab = None
        if draft_vocab is not None:
            self.draft_vocab = torch.tensor(draft_vocab, device=context.device)                # [A]
            rows = lm_head_rows(model, self.draft_vocab, context.dtype, context.device)        # [A, hidden]
            linear = nn.Linear(rows.shape[1], rows.shape[0], bias=False, device=context.device, dtype=context.dtype)
            linear.weight = nn.Parameter(rows, requires_grad=False)
            self.rows = pack_weights(nn.Sequential(linear), context.dtype, "none", context.device)

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        if self.draft_vocab is None:
            return self.full_logits(features)
        chosen = self.rows(features).float()                                                   # [rows, A]
        floor = chosen.amin(dim=-1, keepdim=True) - OUTSIDE_MARGIN                             # [rows, 1]
        logits = floor.expand(len(chosen), self.model.config.vocab_size).clone()               # [rows, vocab]
        return logits.scatter_(1, self.draft_vocab.expand(len(chosen), -1), chosen)


def lm_head_rows(model: LlamaForCausalLM, token_ids: torch.Tensor, dtype: torch.dtype, device: str) -> torch.Tensor:
    """The target's LM head rows for token_ids, [len, hidden], as its own module computes them."""
    if isinstance(model.lm_head, nn.Linear):
        weight = model.lm_head.weight
    elif model.config.tie_word_embeddings:
        weight = model.embed_tokens.weight
    else:       # packed or quantized: the module applied to the identity gives its weight, transposed
        with torch.inference_mode():
            weight = model.lm_head(torch.eye(model.config.hidden_size, dtype=dtype, device=device)).T
    return weight[token_ids].detach().to(dtype=dtype).clone()
