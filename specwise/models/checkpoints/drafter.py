"""A trained drafting head on disk: the directory `specwise train-drafter` writes and
`--speculative eagle:DIR` / `eagle3:DIR` / `medusa:DIR` reads.

    DIR/drafter.json        {"format": "specwise-drafter", "version": 1, "kind": "eagle" | "eagle3" | "medusa",
                             "num_heads": k (medusa), "aux_layers": [low, mid, high] (eagle3),
                             "target": {hidden_size, vocab_size, ...,
                             "tokenizer_sha256"}, "training": {...free-form facts},
                             "draft_vocab": [token ids] or null (optional: the tokens it drafts)}
    DIR/model.safetensors   the head's parameters only (the target's embedding and LM head are reused)
    DIR/README.md           the model card (data, steps, wall time, held-out acceptance)

A head is tied to the target it was trained on: loading checks every shape in "target" and
the tokenizer's fingerprint, and names the first mismatch.
"""

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from specwise.errors import ModelLoadError
from specwise.models.config import ModelConfig
from specwise.models.export.export_formats import DRAFTER_CONFIG
from specwise.models.heads.eagle import EagleHead
from specwise.models.heads.eagle3 import NUM_AUX_LAYERS, Eagle3Head
from specwise.models.heads.medusa import MedusaHeads
from specwise.models.tokenizer import Tokenizer

FORMAT, VERSION = "specwise-drafter", 1
KINDS = ("eagle", "eagle3", "medusa")
CONFIG_FILE, WEIGHTS_FILE, CARD_FILE = DRAFTER_CONFIG, "model.safetensors", "README.md"
SIGNATURE_FIELDS = ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "intermediate_size", "head_dim")


@dataclass
class DrafterConfig:
    kind: str
    target: dict                    # target_signature() of the model it was trained on
    num_heads: int = 0              # medusa: how many heads (the largest k it drafts)
    training: dict = field(default_factory=dict)
    # token ids the head drafts from (e.g. every token the target chose in its training data), or None
    # for the whole vocabulary: the engine then runs the LM head over these rows only, a fraction of
    # its cost, and never drafts another token (lossless: the verifier samples those itself)
    draft_vocab: list[int] | None = None
    # eagle3: the target's layer ids whose residual streams it fuses (models/heads/eagle3.py), low to high
    aux_layers: list[int] | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"drafter kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind == "medusa" and self.num_heads < 1:
            raise ValueError(f"a medusa drafter needs num_heads >= 1, got {self.num_heads}")
        if self.kind == "eagle3" and (not isinstance(self.aux_layers, list) or len(self.aux_layers) != NUM_AUX_LAYERS
                                      or not all(isinstance(i, int) and i >= 0 for i in self.aux_layers)):
            raise ValueError(f"an eagle3 drafter needs aux_layers: {NUM_AUX_LAYERS} layer ids >= 0, "
                             f"got {self.aux_layers!r}")
        if self.draft_vocab is not None:
            if not self.draft_vocab or not all(isinstance(token, int) and token >= 0 for token in self.draft_vocab):
                raise ValueError("draft_vocab must be a non-empty list of token ids >= 0")
            self.draft_vocab = sorted(set(self.draft_vocab))


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
    """SHA-256 of the vocabulary (token text and id, added tokens included)."""
    vocab = sorted(tokenizer.backend.get_vocab(with_added_tokens=True).items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


def target_signature(config: ModelConfig, tokenizer: Tokenizer) -> dict:
    return {**{name: getattr(config, name) for name in SIGNATURE_FIELDS},
            "tokenizer_sha256": tokenizer_fingerprint(tokenizer)}


def build_head(drafter: DrafterConfig, target: ModelConfig, max_positions: int | None = None) -> nn.Module:
    """A freshly initialised head of this kind for this target."""
    if drafter.kind == "eagle":
        return EagleHead(target, max_positions)
    if drafter.kind == "eagle3":
        return Eagle3Head(target, max_positions)
    return MedusaHeads(target.hidden_size, drafter.num_heads)


def save_drafter(directory: str | Path, head: nn.Module, drafter: DrafterConfig, card: str | None = None) -> Path:
    """Write the three files; weights first and the config last, each through a temporary name,
    so an interrupted save never leaves a directory that looks complete."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    weights = {name: param.detach().contiguous().cpu() for name, param in head.named_parameters()}
    _replace(directory / WEIGHTS_FILE, lambda path: save_file(weights, str(path)))
    if card is not None:
        _replace(directory / CARD_FILE, lambda path: path.write_text(card))
    text = json.dumps({"format": FORMAT, "version": VERSION, **asdict(drafter)}, indent=2)
    _replace(directory / CONFIG_FILE, lambda path: path.write_text(text + "\n"))
    return directory


def read_drafter_config(directory: str | Path) -> DrafterConfig:
    directory = Path(directory).expanduser()
    path = directory / CONFIG_FILE
    if not directory.is_dir():
        raise ModelLoadError(directory, "no such drafter directory")
    if not path.is_file():
        raise ModelLoadError(path, "missing: not a drafter directory (train one with specwise train-drafter)")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(path, f"cannot read drafter config: {e}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ModelLoadError(path, f"not a {FORMAT} config (no \"format\": \"{FORMAT}\")")
    if raw.get("version") != VERSION:
        raise ModelLoadError(path, f"drafter format version {raw.get('version')!r}, this specwise reads {VERSION}")
    try:
        return DrafterConfig(kind=raw["kind"], target=dict(raw["target"]), num_heads=int(raw.get("num_heads", 0)),
                             training=dict(raw.get("training", {})), draft_vocab=raw.get("draft_vocab"),
                             aux_layers=raw.get("aux_layers"))
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(path, f"bad drafter config: {e}") from None


def check_target(drafter: DrafterConfig, target: ModelConfig, tokenizer: Tokenizer, path: Path) -> None:
    """The first difference between the target the head was trained on and this one, as an error."""
    expected = target_signature(target, tokenizer)
    for name in (*SIGNATURE_FIELDS, "tokenizer_sha256"):
        if drafter.target.get(name) != expected[name]:
            what = "tokenizer (vocabulary fingerprint)" if name == "tokenizer_sha256" else name
            raise ModelLoadError(path, f"this {drafter.kind} drafter was trained for another target: its {what} "
                                       f"is {drafter.target.get(name)!r}, the target's is {expected[name]!r}")
    if drafter.aux_layers is not None and max(drafter.aux_layers) > target.num_hidden_layers:
        raise ModelLoadError(path, f"aux_layers {drafter.aux_layers} name a layer past the target's "
                                   f"{target.num_hidden_layers}")
    if drafter.draft_vocab is not None and drafter.draft_vocab[-1] >= target.vocab_size:
        raise ModelLoadError(path, f"draft_vocab holds token id {drafter.draft_vocab[-1]}, outside the target's "
                                   f"vocabulary of {target.vocab_size}")


def load_drafter(directory: str | Path, target: ModelConfig, tokenizer: Tokenizer, dtype: torch.dtype,
                 device: str = "cpu", max_positions: int | None = None) -> tuple[DrafterConfig, nn.Module]:
    """Config, checks against the target, weights -> (config, head in eval mode without grads)."""
    directory = Path(directory).expanduser()
    drafter = read_drafter_config(directory)
    check_target(drafter, target, tokenizer, directory / CONFIG_FILE)
    weights_path = directory / WEIGHTS_FILE
    if not weights_path.is_file():
        raise ModelLoadError(weights_path, "missing: the drafter's weights")
    try:
        weights = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelLoadError(weights_path, f"corrupt or truncated weights file: {e}") from None
    head = build_head(drafter, target, max_positions)
    expected = dict(head.named_parameters())
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise ModelLoadError(weights_path, f"weights do not match a {drafter.kind} head: missing {missing[:3]}, "
                                           f"unexpected {unexpected[:3]}")
    for name, tensor in weights.items():
        if tensor.shape != expected[name].shape:
            raise ModelLoadError(weights_path, f"{name} has shape {tuple(tensor.shape)}, "
                                               f"expected {tuple(expected[name].shape)}")
    head.load_state_dict(weights, strict=False)
    rotary = getattr(head, "rotary", None)
    head = head.to(device=device, dtype=dtype)
    if rotary is not None:               # rope tables stay fp32 whatever the compute dtype
        head.rotary = rotary.to(device)
    return drafter, head.eval().requires_grad_(False)


def _replace(path: Path, write) -> None:
    partial = path.with_name(path.name + ".partial")
    write(partial)
    partial.replace(path)
