"""Drafting heads shipped with the package: which one fits the loaded target.

`--speculative eagle` (no directory) drafts with a head from a folder under
specwise/models/heads/ (package data, e.g. heads/smollm2-135m-instruct/eagle/: drafter.json +
model.safetensors + README.md, as checkpoints/drafter.py writes them) whose kind is eagle and
whose drafter.json "target" signature (shapes and tokenizer fingerprint) is the loaded
target's. Directories named in $SPECWISE_HEADS_PATH (separated like PATH, each holding such
folders at any depth) are searched first, so a site can add heads for its own models without
a path on every command.
"""

import os
from pathlib import Path

from specwise.errors import ModelLoadError
from specwise.models.checkpoints.drafter import CONFIG_FILE, read_drafter_config, target_signature
from specwise.models.config import ModelConfig
from specwise.models.tokenizer import Tokenizer

PACKAGE_HEADS = Path(__file__).parent
HEADS_PATH_VARIABLE = "SPECWISE_HEADS_PATH"


def search_roots() -> list[Path]:
    """$SPECWISE_HEADS_PATH's directories, then the package's own heads."""
    extra = os.environ.get(HEADS_PATH_VARIABLE, "")
    return [Path(part).expanduser() for part in extra.split(os.pathsep) if part] + [PACKAGE_HEADS]


def find_builtin_head(kind: str, target: ModelConfig, tokenizer: Tokenizer,
                      roots: list[Path] | None = None) -> Path | None:
    """The first folder under a root (roots in order, paths sorted) holding a `kind` head trained for
    this target, or None. Folders that are not readable drafter directories are passed over."""
    signature = target_signature(target, tokenizer)
    for root in search_roots() if roots is None else roots:
        if not root.is_dir():
            continue
        for directory in sorted(config.parent for config in root.rglob(CONFIG_FILE)):
            try:
                drafter = read_drafter_config(directory)
            except ModelLoadError:
                continue
            if drafter.kind == kind and all(drafter.target.get(name) == value for name, value in signature.items()):
                return directory
    return None
