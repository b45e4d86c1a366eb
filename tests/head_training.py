"""Drafting heads for tests: fitted for a few steps to a target's own greedy text, then saved.

A randomly initialised head drafts tokens the target (almost) never accepts, so an exactness
test would only see recovered tokens. A few dozen Adam steps of teacher forcing on the
target's features make the head draft what the target says often enough that accepted,
recovered and bonus tokens all occur. This is a test fixture, not the trainer
(`specwise train-drafter`): no schedule, no held-out data, no checkpoints.

    sequences = greedy_texts(model, prompts, max_tokens=48)
    directory = fitted_head_dir(tmp_path / "eagle", "eagle", checkpoint, model, sequences, steps=60)
"""

from pathlib import Path

import torch
import torch.nn.functional as F

from specwise.engine.model_runner import ModelRunner
from specwise.models.attention import AttentionMetadata, PrefillChunk, step_metadata
from specwise.models.checkpoints.drafter import DrafterConfig, build_head, save_drafter, target_signature
from specwise.models.heads.eagle import EagleHead
from specwise.models.heads.eagle3 import Eagle3Head, default_aux_layers
from specwise.models.heads.medusa import MedusaHeads
from specwise.models.llama import LlamaForCausalLM

BLOCK_SIZE = 16


def runner_for(model: LlamaForCausalLM, max_len: int, num_sequences: int = 1) -> ModelRunner:
    blocks = -(-max_len // BLOCK_SIZE)
    return ModelRunner(model, blocks * num_sequences, BLOCK_SIZE, next(model.parameters()).dtype)


def greedy_texts(model: LlamaForCausalLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Each prompt followed by the target's greedy continuation (no KV reuse: tiny or short inputs only)."""
    texts = []
    for prompt in prompts:
        runner = runner_for(model, len(prompt) + max_tokens)
        table = list(range(runner.num_blocks))
        tokens = list(prompt)
        for _ in range(max_tokens):
            logits = runner.forward([tokens], [0], [table], [1])
            tokens.append(int(logits.argmax(dim=-1)))
        texts.append(tokens)
    return texts


def features_of(model: LlamaForCausalLM, tokens: list[int]) -> torch.Tensor:
    """The target's feature at every position of `tokens`, [len(tokens), hidden] fp32."""
    runner = runner_for(model, len(tokens))
    return runner.hidden_states([tokens], [0], [list(range(runner.num_blocks))]).float().clone()   # not an inference tensor


def aux_of(model: LlamaForCausalLM, tokens: list[int], layers: list[int]) -> torch.Tensor:
    """The target's residual streams after `layers` at every position, side by side, [len, 3 * hidden] fp32."""
    runner = runner_for(model, len(tokens))
    residuals = dict.fromkeys(layers)
    runner.hidden_states([tokens], [0], [list(range(runner.num_blocks))], residuals=residuals)
    return torch.cat([residuals[layer] for layer in layers], dim=-1).float().clone()


def eagle3_loss(head: Eagle3Head, model: LlamaForCausalLM, tokens: list[int], aux: torch.Tensor) -> torch.Tensor:
    """Pair t = (fc(a_t), x_{t+1}) drafts x_{t+2} (models/heads/eagle3.py), teacher-forced."""
    length = len(tokens) - 1
    config = model.config
    cache = torch.zeros(1, 2, config.num_key_value_heads, length, config.head_dim)
    ids = torch.tensor(tokens)
    with step_metadata(AttentionMetadata(torch.arange(length), [PrefillChunk(0, length)], [])):
        drafted, _ = head.step(head.fuse(aux[:length]), model.embed_tokens(ids[1:]).float(), torch.arange(length),
                               cache)
    return F.cross_entropy(drafted[:-1] @ model.lm_head.weight.float().T, ids[2:])


def eagle_loss(head: EagleHead, model: LlamaForCausalLM, tokens: list[int], features: torch.Tensor) -> torch.Tensor:
    """Pair t = (f_t, x_{t+1}) predicts f_{t+1} and, through the LM head, x_{t+2} (models/heads/eagle.py)."""
    length = len(tokens) - 1                                          # pairs 0 .. len - 2
    config = model.config
    cache = torch.zeros(1, 2, config.num_key_value_heads, length, config.head_dim)   # one layer's keys, values
    metadata = AttentionMetadata(torch.arange(length), [PrefillChunk(0, length)], [])
    ids = torch.tensor(tokens)
    with step_metadata(metadata):
        predicted = head(features[:length], model.embed_tokens(ids[1:]).float(), torch.arange(length),
                         cache)                                       # f̂_1 .. f̂_{len-1}
    logits = predicted[:-1] @ model.lm_head.weight.float().T          # predict x_2 .. x_{len-1}
    return F.cross_entropy(logits, ids[2:]) + F.smooth_l1_loss(predicted, features[1:])


def medusa_loss(heads: MedusaHeads, model: LlamaForCausalLM, tokens: list[int], features: torch.Tensor) -> torch.Tensor:
    """Head i on f_t predicts x_{t+2+i} (models/heads/medusa.py)."""
    ids = torch.tensor(tokens)
    predicted = heads(features)                                       # [len, num_heads, hidden]
    losses = []
    for index in range(heads.num_heads):
        count = len(tokens) - 2 - index
        if count > 0:
            logits = predicted[:count, index] @ model.lm_head.weight.float().T
            losses.append(F.cross_entropy(logits, ids[2 + index:]))
    return sum(losses) / len(losses)


def fit_head(kind: str, model: LlamaForCausalLM, texts: list[list[int]], steps: int, num_heads: int = 0,
             seed: int = 0, lr: float = 3e-3) -> torch.nn.Module:
    """A fresh head (fp32) after `steps` Adam steps over the texts in turn."""
    torch.manual_seed(seed)
    layers = default_aux_layers(model.config.num_hidden_layers) if kind == "eagle3" else None
    head = build_head(DrafterConfig(kind, {}, num_heads, aux_layers=layers), model.config)
    if kind == "medusa":                    # zero-initialised heads only repeat the LM head: start from noise
        for param in head.parameters():
            torch.nn.init.normal_(param, std=0.02)
    if kind == "eagle3":
        features = [aux_of(model, tokens, layers) for tokens in texts]
    else:
        features = [features_of(model, tokens) for tokens in texts]
    loss_of = {"eagle": eagle_loss, "eagle3": eagle3_loss, "medusa": medusa_loss}[kind]
    optimizer = torch.optim.Adam(head.parameters(), lr=lr)
    with torch.enable_grad():
        for step in range(steps):
            index = step % len(texts)
            optimizer.zero_grad()
            loss_of(head, model, texts[index], features[index]).backward()
            optimizer.step()
    return head.eval().requires_grad_(False)


def fitted_head_dir(directory: Path, kind: str, checkpoint, model: LlamaForCausalLM, texts: list[list[int]],
                    steps: int, num_heads: int = 0, draft_vocab: list[int] | None = None) -> Path:
    """fit_head, saved as a drafter directory for this target (drafting from draft_vocab only, if given)."""
    head = fit_head(kind, model, texts, steps, num_heads)
    layers = default_aux_layers(model.config.num_hidden_layers) if kind == "eagle3" else None
    drafter = DrafterConfig(kind, target_signature(checkpoint.config, checkpoint.tokenizer), num_heads,
                            training={"steps": steps, "note": "test fixture"}, draft_vocab=draft_vocab,
                            aux_layers=layers)
    return save_drafter(directory, head, drafter)
