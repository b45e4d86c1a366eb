"""Teacher-forced scoring of model drafters (draft:PATH, layer_skip:L) over logged traffic.

One forward pass of the drafter over prompt + completion (in chunks, through the engine's
ModelRunner and a paged KV cache of its own) gives its greedy next token after every prefix:
    pred[t] = argmax p_drafter(. | tokens[0 .. t])
Drafting k tokens from context length L greedily yields pred[L - 1], then, if that equalled
the completion's token, pred[L], and so on: while the chain matches, the drafter's own
context is the logged one, so teacher forcing reproduces its chain exactly up to the first
mismatch, and nothing after a mismatch is accepted. replay.py counts the matches.

This is the greedy (temperature 0) acceptance. Sampled traffic accepts a draft token with
probability min(1, p_target / p_draft), which a log of sampled text alone cannot give.

  layer_skip:L   the target's own first L layers with its final norm and LM head
  draft:PATH     a smaller model with the target's tokenizer (the vocabularies are checked)
"""

import torch

from specwise.engine.model_runner import ModelRunner
from specwise.engine.spec_decode.config import SpeculativeConfig
from specwise.engine.spec_decode.draft_model import check_same_vocabulary
from specwise.models.checkpoints.loader import Checkpoint, build_model, load_checkpoint

CHUNK = 512            # tokens per forward: logits of one chunk are [CHUNK, vocab] fp32
BLOCK_SIZE = 16


class TeacherForcedDrafter:
    def __init__(self, model, dtype: torch.dtype, device: str, num_layers: int | None = None):
        self.model = model
        self.dtype = dtype
        self.device = device
        self.num_layers = num_layers
        self.runner: ModelRunner | None = None
        self.pred: list[int] = []

    def prepare(self, token_ids: list[int]) -> None:
        vocab = self.model.config.vocab_size
        ids = [token if token < vocab else 0 for token in token_ids]    # ids the drafter has no embedding for
        blocks = -(-len(ids) // BLOCK_SIZE)
        if self.runner is None or self.runner.num_blocks < blocks:
            grown = max(blocks, 2 * self.runner.num_blocks if self.runner else 0)
            self.runner = None                                          # free the old cache first
            self.runner = ModelRunner(self.model, grown, BLOCK_SIZE, self.dtype, self.device)
        table = list(range(blocks))
        pred = []
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start:start + CHUNK]
            logits = self.runner.forward([chunk], [start], [table], [len(chunk)], self.num_layers)  # [chunk, vocab]
            pred += logits.argmax(dim=-1).tolist()
        self.pred = pred

    def draft(self, token_ids: list[int], context_len: int, k: int) -> list[int]:
        return self.pred[context_len - 1:context_len - 1 + k]


def model_drafter(spec: SpeculativeConfig, target: Checkpoint | None, target_path: str | None,
                  tokenizer, dtype: torch.dtype, device: str) -> TeacherForcedDrafter:
    """The drafter a `draft:PATH` or `layer_skip:L` config names, ready to score."""
    if spec.method == "layer_skip":
        checkpoint = target or load_checkpoint(target_path, dtype)
        spec.check_num_layers(checkpoint.config.num_hidden_layers)
        layers = spec.layer_skip_layers
    else:
        checkpoint = load_checkpoint(spec.draft_model, dtype)
        check_same_vocabulary(tokenizer, checkpoint.tokenizer, spec.draft_model)
        layers = None
    model = build_model(checkpoint, dtype, device, checkpoint.config.max_position_embeddings)
    return TeacherForcedDrafter(model, dtype, device, layers)
