"""`specwise export-drafter`: a drafter directory written in a serving engine's own checkpoint format.

    eagle  -> vLLM: EagleMistralForCausalLM (vllm_eagle.py); the draft vocabulary, which vLLM's EAGLE
              path cannot hold, is expanded to the full vocabulary (drafts may then differ where the
              full vocabulary's argmax lies outside it)
    eagle3 -> vLLM: Eagle3LlamaForCausalLM (vllm_eagle3.py), draft vocabulary kept (its LM head + d2t)
    medusa -> vLLM: MedusaModel (vllm_medusa.py); the draft vocabulary expanded too (vLLM 0.32.0 fails
              to load the token_map its format has for it)
    draft  -> vLLM and SGLang: the HF directory as it is (vLLM's method draft_model, SGLang's STANDALONE)

SGLang's EAGLE draft models (python/sglang/srt/models/llama_eagle.py, read at commit 034b3be) apply no
final norm to the draft's output and skip layer 0's input norm; our head has both, so an EAGLE head is
refused for SGLang, as are Medusa heads (SGLang has no Medusa method).

The export is written to a temporary directory beside OUT and renamed to OUT when complete, so an
error never leaves a half-written OUT.
"""

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from specwise.errors import ConfigError, ModelLoadError
from specwise.models.checkpoints.drafter import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE, load_drafter, read_drafter_config
from specwise.models.export.export_formats import (EXPORT_FORMATS, SGLANG_COMMIT, SGLANG_REFUSALS, VLLM_METHODS,
                                                  VLLM_VERSION)
from specwise.models.checkpoints.loader import Checkpoint
from specwise.models.export.vllm_eagle import write_eagle
from specwise.models.export.vllm_eagle3 import write_eagle3
from specwise.models.export.vllm_medusa import write_medusa

VOCABULARY_REASONS = {          # why a draft vocabulary cannot be kept, per kind
    "eagle": "vLLM's EAGLE method drafts over the target's whole LM head",
    "medusa": "vLLM 0.32.0's Medusa loader fails on the token_map that would hold it (vllm_medusa.py)",
}
HF_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


@dataclass
class Export:
    out: Path
    kind: str
    notes: list[str] = field(default_factory=list)     # conversions made, one line each
    launch: str = ""                                    # the engine's speculative setting for OUT


def drafter_kind(directory: Path) -> str:
    """eagle / medusa (a drafter.json) or draft (an HF model directory); anything else: ConfigError."""
    if not directory.is_dir():
        raise ConfigError(f"{directory}: no such drafter directory")
    if (directory / CONFIG_FILE).is_file():
        return read_drafter_config(directory).kind
    if (directory / "config.json").is_file() and (directory / "model.safetensors").is_file():
        return "draft"
    raise ConfigError(f"{directory}: not a drafter directory (no {CONFIG_FILE}, and no config.json + "
                      f"model.safetensors of a draft model); train one with specwise train-drafter")


def check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out}: exists and is not an empty directory; choose a new --out")


def check_format(kind: str, fmt: str, directory: Path | str) -> None:
    """A format this kind cannot be written in: one-line ConfigError (train-drafter --export asks first)."""
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    if fmt == "sglang" and kind in SGLANG_REFUSALS:
        raise ConfigError(f"{directory}: cannot export this {kind} drafter for SGLang: {SGLANG_REFUSALS[kind]}")


def check_export(directory: str | Path, fmt: str, out: str | Path) -> str:
    """Everything about an export that needs no target, checked before one is loaded -> the drafter's kind."""
    check_out(Path(out).expanduser())
    kind = drafter_kind(Path(directory).expanduser())
    check_format(kind, fmt, directory)
    return kind


def export_drafter(directory: str | Path, fmt: str, out: str | Path, target: Checkpoint) -> Export:
    kind = check_export(directory, fmt, out)
    directory, out = Path(directory).expanduser(), Path(out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        export = _write(directory, kind, fmt, staging, target)
        check_out(out)                                   # still free now that the files are ready
        _open_permissions(staging)
        if out.exists():
            out.rmdir()
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    export.out = out
    export.launch = launch_setting(kind, fmt, out)
    return export


def _open_permissions(directory: Path) -> None:
    """mkdtemp makes a private directory; the export gets the modes of any directory the user makes."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.iterdir():
        path.chmod(0o666 & ~umask)


def _write(directory: Path, kind: str, fmt: str, staging: Path, target: Checkpoint) -> Export:
    export = Export(out=staging, kind=kind)
    if kind == "draft":
        _write_draft_model(directory, staging, target)
    else:
        drafter, head = load_drafter(directory, target.config, target.tokenizer, torch.float32)
        dtype = stored_dtype(directory / WEIGHTS_FILE)
        if drafter.draft_vocab is not None and kind in VOCABULARY_REASONS:
            export.notes.append(f"draft vocabulary of {len(drafter.draft_vocab)} tokens expanded to the full "
                                f"{target.config.vocab_size}: {VOCABULARY_REASONS[kind]}")
        if kind == "eagle":
            write_eagle(staging, head, dtype)
        elif kind == "eagle3":
            if len(set(drafter.aux_layers)) != len(drafter.aux_layers):
                raise ConfigError(f"{directory}: aux_layers {drafter.aux_layers} repeat a layer, and vLLM reads "
                                  f"each layer once: this eagle3 head cannot be exported for vLLM")
            write_eagle3(staging, head, drafter.aux_layers, target_lm_head(target), drafter.draft_vocab, dtype)
        else:
            write_medusa(staging, head, target_lm_head(target), dtype)
    (staging / CARD_FILE).write_text(export_card(directory, kind, fmt, export.notes))
    return export


def _write_draft_model(directory: Path, staging: Path, target: Checkpoint) -> None:
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(directory / "config.json", f"cannot read: {e}") from None
    if config.get("vocab_size") != target.config.vocab_size:
        raise ConfigError(f"{directory}: a draft model with vocab_size {config.get('vocab_size')}, the target's is "
                          f"{target.config.vocab_size}: the engines need the target's vocabulary")
    for name in HF_FILES:
        if (directory / name).is_file():
            shutil.copy2(directory / name, staging / name)


def stored_dtype(path: Path) -> torch.dtype:
    """The dtype the head was saved in (the shipped heads: bf16), kept so the export adds no rounding."""
    with safe_open(str(path), "pt") as weights:
        dtypes = {weights.get_slice(name).get_dtype() for name in weights.keys()}
    return torch.bfloat16 if dtypes == {"BF16"} else torch.float32


def target_lm_head(target: Checkpoint) -> torch.Tensor:
    name = "model.embed_tokens.weight" if target.config.tie_word_embeddings else "lm_head.weight"
    return target.weights[name]


def launch_setting(kind: str, fmt: str, out: Path) -> str:
    """How the engine is told to use OUT (k: num_speculative_tokens, here 4)."""
    if fmt == "sglang":
        return f"--speculative-algorithm STANDALONE --speculative-draft-model-path {out}"
    method = VLLM_METHODS[kind]
    return f"--speculative-config '{{\"method\": \"{method}\", \"model\": \"{out}\", \"num_speculative_tokens\": 4}}'"


def export_card(directory: Path, kind: str, fmt: str, notes: list[str]) -> str:
    engine = f"vLLM {VLLM_VERSION}" if fmt == "vllm" else f"SGLang (commit {SGLANG_COMMIT})"
    what = {"eagle": "an EAGLE head as vLLM's EagleMistralForCausalLM (method eagle)",
            "eagle3": "an EAGLE-3 head as vLLM's Eagle3LlamaForCausalLM (method eagle3)",
            "medusa": "Medusa heads as vLLM's MedusaModel (method medusa)",
            "draft": "a distilled draft model, a Hugging Face directory"}[kind]
    lines = [f"# {kind} drafter exported for {engine}", "",
             f"Written by `specwise export-drafter {directory} --format {fmt}`: {what}, in the checkpoint format "
             f"of {engine}'s loaders (read from its source).", "",
             f"Use: `{launch_setting(kind, fmt, Path('THIS_DIR'))}` next to the target model it was trained for.", ""]
    if notes:
        lines += ["Converted:", "", *[f"- {note}" for note in notes], ""]
    if (directory / CARD_FILE).is_file():               # the training card, its headings one level down
        card = (directory / CARD_FILE).read_text().splitlines()
        lines += ["## The drafter as trained", "", *[f"#{line}" if line.startswith("#") else line for line in card]]
    return "\n".join(lines).rstrip() + "\n"
