"""The head an `eagle[:DIR]` / `medusa[:DIR]` drafter runs: from DIR, or the built-in one for the target.

Shared by eagle.py and medusa.py: a directory of another kind, or no built-in head for this
target, is a one-line ConfigError that says what to do instead.
"""

from pathlib import Path

from torch import nn

from specwise.engine.spec_decode.context import ProposerContext
from specwise.errors import ConfigError
from specwise.models.builtin_heads import find_builtin_head
from specwise.models.drafter_checkpoint import DrafterConfig, load_drafter
from specwise.models.quantize import pack_weights


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
