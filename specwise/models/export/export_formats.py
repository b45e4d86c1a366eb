"""What each serving engine's drafter checkpoints can hold, and where an export goes; no torch, so
train-drafter's flags and the report's server configs read it too (drafter_export.py writes the files).

Formats read from vLLM 0.32.0's source and SGLang's (python/sglang/srt/models/, commit 034b3be).
"""

from pathlib import Path, PurePath

EXPORT_FORMATS = ("vllm", "sglang")
DRAFTER_CONFIG = "drafter.json"     # marks a specwise drafter directory (checkpoints/drafter.py writes it)
VLLM_VERSION = "0.32.0"
SGLANG_COMMIT = "034b3be"
VLLM_METHODS = {"eagle": "eagle", "eagle3": "eagle3", "medusa": "medusa", "draft": "draft_model"}   # kind -> method
SGLANG_REFUSALS = {
    "eagle": "SGLang's EAGLE draft models apply no final norm to the draft's output (and none before layer 0's "
             "attention), and specwise's EAGLE head has both; serve it with vLLM (--format vllm)",
    "eagle3": "SGLang's EAGLE-3 checkpoint format was not read for this export; serve it with vLLM (--format vllm)",
    "medusa": "SGLang has no Medusa method; serve Medusa heads with vLLM (--format vllm)",
}


def export_dir(drafter_dir: str, fmt: str) -> str:
    """Where `train-drafter --export FORMAT` writes, and where the report's configs point: DIR/export-FORMAT."""
    return str(PurePath(drafter_dir) / f"export-{fmt}")


def export_command(drafter_dir: str, fmt: str) -> str:
    return f"specwise export-drafter {drafter_dir} --format {fmt} --out {export_dir(drafter_dir, fmt)}"


def is_specwise_drafter(directory: str) -> bool:
    """A directory in specwise's own head format (as opposed to a checkpoint in a server's format)."""
    return (Path(directory).expanduser() / DRAFTER_CONFIG).is_file()
