"""EAGLE-3 drafting head: the target's residual stream at a low, a middle and a high layer, fused, then
one decoder layer whose attention reads [embedding ; hidden] side by side.

Layer id L names the residual stream after the target's first L decoder layers, before the final norm
(L = 0: the embeddings); vLLM 0.32's default for an N-layer target is (2, N // 2, N - 3), ours too (a
target under 6 layers: (0, N // 2, N)). a_t = [r_low,t ; r_mid,t ; r_high,t], [3H].

    step 1, pair t:  h = fc(a_t)                                            [3H] -> [H]
    every step:      x = [input_norm(embed(x_{t+1})) ; hidden_norm(h)]      [2H], the attention's input
                     r = h + attn(x)            r = r + mlp(post_norm(r))   (the residual is h itself)
                     draft from lm_head(norm(r)); feed r (not normed) back as the next step's h

Worked example, the target just emitted x_4 (features to position 3): pairs 0..3 are (fc(a_0), x_1) ..
(fc(a_3), x_4) and pair 3 drafts d_1; pair 4 is (r_4, d_1), r_4 the layer's own output at pair 3, and
drafts d_2; and so on. Against EAGLE (eagle.py) nothing regresses the target's feature: what is fed
back is whatever the layer found useful (trained on tokens only, with the unrolled training-time test).

The K/V is paged like eagle.py's (pair t in the slot of position t). The embedding and LM head are the
target's (the LM head cut to the drafter's draft vocabulary where it has one).
"""

import torch
from torch import nn

from specwise.models.config import ModelConfig
from specwise.models.llama import MLP, Attention, RMSNorm
from specwise.models.rope import RotaryEmbedding

NUM_AUX_LAYERS = 3


def default_aux_layers(num_layers: int) -> list[int]:
    """Layer ids of the fused residual streams, distinct and ascending (vLLM collects each once, in
    order): vLLM's default, or for a target under 6 layers the embeddings, the middle and the last."""
    if num_layers >= 6:
        return [2, num_layers // 2, num_layers - 3]
    return [0, num_layers // 2, num_layers]


class Eagle3Layer(nn.Module):
    """A Llama decoder layer whose q/k/v read [input_norm(embedding) ; hidden_norm(hidden)], [2H]."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        hidden = config.hidden_size
        self.input_layernorm = RMSNorm(hidden, config.rms_norm_eps)       # on the embeddings
        self.hidden_norm = RMSNorm(hidden, config.rms_norm_eps)           # on the fed hidden state
        self.self_attn = Attention(config, 0)                             # layer 0 of its own KV cache
        qkv_size = (config.num_attention_heads + 2 * config.num_key_value_heads) * config.head_dim
        self.self_attn.qkv_proj = nn.Linear(2 * hidden, qkv_size, bias=config.attention_bias)
        self.post_attention_layernorm = RMSNorm(hidden, config.rms_norm_eps)
        self.mlp = MLP(config)

    def attention_input(self, hidden: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.input_layernorm(embeddings), self.hidden_norm(hidden)], dim=-1)

    def forward(self, hidden, embeddings, rope, kv_cache):
        hidden = hidden + self.self_attn(self.attention_input(hidden, embeddings), rope, kv_cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Head(nn.Module):
    def __init__(self, config: ModelConfig, max_positions: int | None = None):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(NUM_AUX_LAYERS * hidden, hidden, bias=False)
        self.layer = Eagle3Layer(config)
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, max_positions or config.max_position_embeddings,
                                      config.rope_theta, config.rope_scaling)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's three residual streams [n, 3H] -> the first step's hidden [n, H]."""
        return self.fc(aux)

    def step(self, hidden: torch.Tensor, embeddings: torch.Tensor, positions: torch.Tensor,
             kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden h (fused, or fed back) and embeddings of x_{t+1}, [n, H] each, at positions t [n] ->
        (what the LM head drafts from, norm(r); what is fed back, r), [n, H] each. kv_cache
        [1, 2, kv_heads, num_slots, head_dim]; the step's metadata is set around the call."""
        rope = self.rotary(positions, hidden.dtype)
        out = self.layer(hidden, embeddings, rope, kv_cache)
        return self.norm(out), out
