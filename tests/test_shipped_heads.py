"""The drafters shipped for the default model: well-formed, small, carded, and loadable by it."""

import json
from pathlib import Path

import pytest
import torch

import specwise
from specwise.models.checkpoints.drafter import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE, load_drafter, read_drafter_config
from specwise.models.checkpoints.loader import load_checkpoint
from capability_marks import cpu_kernels
from tiny_checkpoints import real_model_path  # noqa: F401 (fixture)

HEADS = Path(specwise.__file__).parent / "models" / "heads" / "smollm2-135m-instruct"
SHIPPED = sorted(path for path in HEADS.iterdir() if path.is_dir()) if HEADS.is_dir() else []
MAX_BYTES = 20 * 2**20


def test_an_eagle_head_is_shipped():
    assert HEADS / "eagle" in SHIPPED


@pytest.mark.parametrize("directory", SHIPPED, ids=lambda path: path.name)
def test_a_shipped_head_is_small_and_carded(directory):
    drafter = read_drafter_config(directory)
    assert drafter.kind == directory.name
    assert (directory / WEIGHTS_FILE).stat().st_size <= MAX_BYTES
    card = (directory / CARD_FILE).read_text()
    for category in ("chat", "math", "all"):
        assert f"| {category} |" in card
    assert drafter.training["held_out_acceptance"]["all"]["drafts"] > 0
    assert json.loads((directory / CONFIG_FILE).read_text())["target"]["hidden_size"] == 576


@pytest.mark.integration
@cpu_kernels
@pytest.mark.parametrize("directory", SHIPPED, ids=lambda path: path.name)
def test_a_shipped_head_loads_for_the_default_model(real_model_path, directory):
    checkpoint = load_checkpoint(real_model_path, torch.bfloat16)
    drafter, head = load_drafter(directory, checkpoint.config, checkpoint.tokenizer, torch.bfloat16)
    assert drafter.kind == directory.name
    assert all(param.dtype == torch.bfloat16 for param in head.parameters())
