"""The drafter directory: save, load, and a one-line error for every way it can be wrong."""

import json

import pytest
import torch

from specwise.errors import ModelLoadError
from specwise.models.checkpoints.drafter import (CONFIG_FILE, WEIGHTS_FILE, DrafterConfig, build_head,
                                                load_drafter, save_drafter, target_signature)
from specwise.models.heads.eagle import EagleHead
from specwise.models.heads.medusa import MedusaHeads
from tiny_models import byte_tokenizer, tiny_checkpoint


@pytest.fixture(scope="module")
def target():
    return tiny_checkpoint()


def saved(tmp_path, target, kind="eagle", num_heads=0):
    drafter = DrafterConfig(kind, target_signature(target.config, target.tokenizer), num_heads)
    torch.manual_seed(0)
    head = build_head(drafter, target.config)
    for param in head.parameters():
        torch.nn.init.normal_(param, std=0.1)
    return save_drafter(tmp_path / kind, head, drafter, card="# card\n"), head


@pytest.mark.parametrize("kind,num_heads,cls", [("eagle", 0, EagleHead), ("medusa", 3, MedusaHeads)])
def test_round_trip_keeps_every_parameter(tmp_path, target, kind, num_heads, cls):
    directory, head = saved(tmp_path, target, kind, num_heads)
    drafter, loaded = load_drafter(directory, target.config, target.tokenizer, torch.float32)
    assert isinstance(loaded, cls) and drafter.kind == kind and drafter.num_heads == num_heads
    original = dict(head.named_parameters())
    for name, param in loaded.named_parameters():
        assert torch.equal(param, original[name]), name
    assert not any(param.requires_grad for param in loaded.parameters())
    assert (directory / "README.md").read_text() == "# card\n"


def test_another_target_is_named(tmp_path, target):
    directory, _ = saved(tmp_path, target)
    wider = tiny_checkpoint(hidden_size=128)
    with pytest.raises(ModelLoadError, match="its hidden_size is 64, the target's is 128"):
        load_drafter(directory, wider.config, wider.tokenizer, torch.float32)


def test_another_tokenizer_is_named(tmp_path, target):
    directory, _ = saved(tmp_path, target)
    config = json.loads((directory / CONFIG_FILE).read_text())
    config["target"]["tokenizer_sha256"] = "0" * 64
    (directory / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="tokenizer"):
        load_drafter(directory, target.config, byte_tokenizer(), torch.float32)


def test_truncated_weights_name_the_file(tmp_path, target):
    directory, _ = saved(tmp_path, target)
    weights = directory / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:200])
    with pytest.raises(ModelLoadError, match=f"{WEIGHTS_FILE}: corrupt or truncated"):
        load_drafter(directory, target.config, target.tokenizer, torch.float32)


@pytest.mark.parametrize("text,problem", [("{not json", "cannot read drafter config"),
                                          ('{"format": "other"}', "not a specwise-drafter config"),
                                          ('{"format": "specwise-drafter", "version": 1, "kind": "tree", '
                                           '"target": {}}', "kind must be one of")])
def test_bad_config_is_one_line(tmp_path, target, text, problem):
    directory, _ = saved(tmp_path, target)
    (directory / CONFIG_FILE).write_text(text)
    with pytest.raises(ModelLoadError, match=problem) as error:
        load_drafter(directory, target.config, target.tokenizer, torch.float32)
    assert "\n" not in str(error.value) and CONFIG_FILE in str(error.value)


def test_missing_directory(tmp_path, target):
    with pytest.raises(ModelLoadError, match="no such drafter directory"):
        load_drafter(tmp_path / "nowhere", target.config, target.tokenizer, torch.float32)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="not a drafter directory"):
        load_drafter(tmp_path / "empty", target.config, target.tokenizer, torch.float32)


def test_untrained_medusa_heads_repeat_the_feature(target):
    heads = MedusaHeads(target.config.hidden_size, 2)
    features = torch.randn(5, target.config.hidden_size)
    assert torch.equal(heads(features), features.unsqueeze(1).expand(5, 2, -1))
