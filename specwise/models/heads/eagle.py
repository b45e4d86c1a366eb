"""EAGLE-style drafting head: one decoder layer that extrapolates the target's features.

A feature is the target's final-normed hidden state, the vector its LM head reads: f_t, at
position t, gives the logits of token t+1. The head pairs each feature with the embedding of
the token that followed it and predicts the next feature:

    pair at position t:  u_t = fc([f_t ; embed(x_{t+1})])                  [2H] -> [H]
    one decoder layer over pairs 0..t (causal, its own K/V), then a norm  -> f̂_{t+1}
    draft token t+2 from lm_head(f̂_{t+1}), the target's own LM head

Worked example: a sequence x_0..x_4 where x_4 is the token the target just emitted, so the
target has features f_0..f_3. Pairs 0..3 are (f_0, x_1) .. (f_3, x_4); pair 3 yields f̂_4 and
draft d_1 (for position 5). Pair 4 is (f̂_4, d_1): a predicted feature, since the target has
not run on x_4 yet; it yields f̂_5 and d_2, and so on. k drafts run the layer k times, one
query per sequence each time. After verification the pairs from predicted features are
recomputed from the target's true ones.

The layer's K/V live in a paged cache addressed like the target's (same block tables, pair t
in the slot of position t), so the scheduler's lookahead slots serve the head too and a
rejected pair is overwritten next step. The embedding and the LM head are the target's:
neither stored nor trained here.
"""

import torch
from torch import nn

from specwise.models.config import ModelConfig
from specwise.models.llama import DecoderLayer, RMSNorm
from specwise.models.rope import RotaryEmbedding


class EagleHead(nn.Module):
    def __init__(self, config: ModelConfig, max_positions: int | None = None):
        super().__init__()
        self.config = config                      # the target's: the layer has its shapes
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layer = DecoderLayer(config, 0)        # layer 0 of its own KV cache
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, max_positions or config.max_position_embeddings,
                                      config.rope_theta, config.rope_scaling)

    def forward(self, features: torch.Tensor, embeddings: torch.Tensor, positions: torch.Tensor,
                kv_cache: torch.Tensor) -> torch.Tensor:
        """features f_t and embeddings of x_{t+1}, [num_tokens, hidden] each, at positions t
        [num_tokens] (flat, see attention.py) -> predicted features f̂_{t+1} [num_tokens, hidden].
        kv_cache [1, 2, kv_heads, num_slots, head_dim]; the step's metadata is set around the call."""
        hidden = self.fc(torch.cat([features, embeddings], dim=-1))          # [num_tokens, hidden]
        rope = self.rotary(positions, hidden.dtype)
        return self.norm(self.layer(hidden, rope, kv_cache))

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The first step's input from the target's features: f_t itself (EAGLE-3 fuses three layers here)."""
        return features

    def step(self, features: torch.Tensor, embeddings: torch.Tensor, positions: torch.Tensor,
             kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(what the LM head drafts from, what is fed back): both f̂_{t+1} (the engine's drafting protocol,
        shared with eagle3.py's head)."""
        predicted = self(features, embeddings, positions, kv_cache)
        return predicted, predicted

    def parameter_names(self) -> list[str]:
        return [name for name, _ in self.named_parameters()]
