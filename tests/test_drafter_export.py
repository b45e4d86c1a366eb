"""export-drafter: a head written in vLLM's format and read back as vLLM's loader reads it gives our head's
logits on the same features; every bad input is one line and leaves nothing behind."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specwise.cli import main
from specwise.errors import ConfigError, ModelLoadError
from specwise.models.attention import AttentionMetadata, PrefillChunk, step_metadata
from specwise.models.checkpoints.drafter import DrafterConfig, build_head, save_drafter, target_signature
from specwise.models.checkpoints.loader import build_model
from specwise.models.export.drafter_export import export_drafter
from specwise.models.export.vllm_eagle import exported_eagle_forward, read_eagle
from specwise.models.export.vllm_eagle3 import exported_eagle3_forward, read_eagle3
from specwise.models.export.vllm_medusa import exported_medusa_logits, read_medusa
from specwise.models.heads.eagle3 import default_aux_layers
from draft_dirs import write_first_layers_draft
from tiny_models import tiny_checkpoint

DRAFT_VOCAB = [1, 5, 9, 17, 33, 40, 41, 42, 60]


def saved_head(directory, target, kind, num_heads=0, draft_vocab=None, seed=0):
    """A head with every parameter drawn at random (so a swapped or transposed tensor shows), saved."""
    drafter = DrafterConfig(kind, target_signature(target.config, target.tokenizer), num_heads,
                            draft_vocab=draft_vocab)
    torch.manual_seed(seed)
    head = build_head(drafter, target.config)
    for name, param in head.named_parameters():
        torch.nn.init.normal_(param, mean=1.0 if "norm" in name else 0.0, std=0.1)      # norm scales around 1
    return save_drafter(directory, head, drafter, card="# card\n\ntrained on nothing\n"), head


def our_eagle(head, target_model, tokens, features):
    """Our head over one sequence: pairs t = (f_t, x_{t+1}) -> predicted features [len - 1, hidden]."""
    length = len(tokens) - 1
    config = target_model.config
    cache = torch.zeros(1, 2, config.num_key_value_heads, length, config.head_dim)
    ids = torch.tensor(tokens)
    with step_metadata(AttentionMetadata(torch.arange(length), [PrefillChunk(0, length)], [])):
        return head(features[:length], target_model.embed_tokens(ids[1:]).float(), torch.arange(length), cache)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_exported_eagle_gives_our_logits(tmp_path, arch):
    target = tiny_checkpoint(arch)
    model = build_model(target, torch.float32, "cpu", 64, plain=True)      # its weights read below
    directory, head = saved_head(tmp_path / "eagle", target, "eagle")
    export = export_drafter(directory, "vllm", tmp_path / "out", target)
    assert export.kind == "eagle" and not export.notes
    config, weights = read_eagle(tmp_path / "out")
    assert config["architectures"] == ["EagleMistralForCausalLM"] and config["num_hidden_layers"] == 1
    assert config["sliding_window"] is None and config["rope_theta"] == target.config.rope_theta
    assert not any("embed_tokens" in name or "lm_head" in name for name in weights)   # shared from the target

    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, target.config.vocab_size, (12,), generator=generator).tolist()
    features = torch.randn(len(tokens), target.config.hidden_size, generator=generator)
    ours = our_eagle(head, model, tokens, features)
    embeddings = model.embed_tokens(torch.tensor(tokens[1:])).float()
    theirs = exported_eagle_forward(config, weights, features[:-1], embeddings, torch.arange(len(tokens) - 1))
    lm_head = model.lm_head.weight.float()
    torch.testing.assert_close(theirs @ lm_head.T, ours @ lm_head.T, rtol=1e-4, atol=1e-4)
    assert (tmp_path / "out" / "README.md").read_text().count("trained on nothing") == 1


def test_eagle_draft_vocabulary_is_expanded_and_said(tmp_path):
    target = tiny_checkpoint()
    directory, _ = saved_head(tmp_path / "eagle", target, "eagle", draft_vocab=DRAFT_VOCAB)
    export = export_drafter(directory, "vllm", tmp_path / "out", target)
    assert export.notes == [f"draft vocabulary of {len(DRAFT_VOCAB)} tokens expanded to the full "
                            f"{target.config.vocab_size}: vLLM's EAGLE method drafts over the target's whole LM head"]
    assert "expanded to the full" in (tmp_path / "out" / "README.md").read_text()


@pytest.mark.parametrize("draft_vocab", [None, DRAFT_VOCAB])
def test_exported_medusa_gives_our_logits(tmp_path, draft_vocab):
    target = tiny_checkpoint()
    model = build_model(target, torch.float32, "cpu", 64, plain=True)      # its weights read below
    directory, heads = saved_head(tmp_path / "medusa", target, "medusa", num_heads=3, draft_vocab=draft_vocab)
    export = export_drafter(directory, "vllm", tmp_path / "out", target)
    config, weights = read_medusa(tmp_path / "out")
    assert config["num_heads"] == 3 and config["original_lm_head"] and config["medusa_fc_bias"]
    assert "token_map" not in weights and config["truncated_vocab_size"] == target.config.vocab_size
    assert bool(export.notes) == (draft_vocab is not None)            # expanded, and said
    features = torch.randn(5, target.config.hidden_size, generator=torch.Generator().manual_seed(2))
    theirs = exported_medusa_logits(config, weights, features)                  # [5, 3, vocab]
    torch.testing.assert_close(theirs, heads(features) @ model.lm_head.weight.float().T, rtol=1e-4, atol=1e-4)


def test_draft_model_is_copied_as_an_hf_directory(tmp_path):
    target = tiny_checkpoint()
    source = write_first_layers_draft(target, 1, tmp_path / "draft")
    export = export_drafter(source, "sglang", tmp_path / "out", target)
    assert export.kind == "draft" and "STANDALONE" in export.launch
    assert load_file(str(tmp_path / "out" / "model.safetensors")).keys() == load_file(
        str(source / "model.safetensors")).keys()
    configs = [json.loads((directory / "config.json").read_text()) for directory in (tmp_path / "out", source)]
    assert configs[0] == configs[1]


def test_the_command_writes_and_says_how_to_serve(tmp_path, capsys, monkeypatch):
    target = tiny_checkpoint()
    directory, _ = saved_head(tmp_path / "eagle", target, "eagle", draft_vocab=DRAFT_VOCAB)
    monkeypatch.setattr("specwise.models.checkpoints.loader.load_checkpoint", lambda path: target)
    assert main(["export-drafter", str(directory), "--format", "vllm", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "converted: draft vocabulary of 9 tokens" in printed
    assert '"method": "eagle"' in printed and (tmp_path / "out" / "config.json").is_file()


# Bad input: one line each, nothing half-written.

def leftovers(tmp_path):
    return sorted(path.name for path in tmp_path.iterdir() if path.name.startswith("."))


def one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_a_directory_that_is_not_a_drafter(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("hello")
    with pytest.raises(ConfigError) as error:
        export_drafter(tmp_path / "notes", "vllm", tmp_path / "out", tiny_checkpoint())
    assert "not a drafter directory" in one_line(error)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_an_eagle_head_for_sglang_is_refused_with_the_reason(tmp_path):
    target = tiny_checkpoint()
    directory, _ = saved_head(tmp_path / "eagle", target, "eagle")
    with pytest.raises(ConfigError) as error:
        export_drafter(directory, "sglang", tmp_path / "out", target)
    assert "no final norm" in one_line(error)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_a_head_for_another_target(tmp_path):
    directory, _ = saved_head(tmp_path / "eagle", tiny_checkpoint(), "eagle")
    with pytest.raises(ModelLoadError) as error:
        export_drafter(directory, "vllm", tmp_path / "out", tiny_checkpoint(hidden_size=128))
    assert "trained for another target" in one_line(error)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_a_draft_model_with_another_vocabulary(tmp_path):
    source = write_first_layers_draft(tiny_checkpoint(), 1, tmp_path / "draft")
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "vocab_size": 4096}))
    with pytest.raises(ConfigError) as error:
        export_drafter(source, "vllm", tmp_path / "out", tiny_checkpoint())
    assert "vocab_size 4096" in one_line(error)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_an_existing_non_empty_out_is_left_alone(tmp_path):
    target = tiny_checkpoint()
    directory, _ = saved_head(tmp_path / "eagle", target, "eagle")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep me")
    with pytest.raises(ConfigError) as error:
        export_drafter(directory, "vllm", tmp_path / "out", target)
    assert "not an empty directory" in one_line(error)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["mine.txt"] and leftovers(tmp_path) == []


def test_an_empty_out_is_filled(tmp_path):
    target = tiny_checkpoint()
    directory, _ = saved_head(tmp_path / "eagle", target, "eagle")
    (tmp_path / "out").mkdir()
    export_drafter(directory, "vllm", tmp_path / "out", target)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["README.md", "config.json", "model.safetensors"]


def test_a_failure_while_writing_leaves_nothing(tmp_path, monkeypatch):
    target = tiny_checkpoint()
    directory, _ = saved_head(tmp_path / "eagle", target, "eagle")

    def broken(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr("specwise.models.export.drafter_export.export_card", broken)
    with pytest.raises(OSError):
        export_drafter(directory, "vllm", tmp_path / "out", target)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_a_reader_names_a_wrong_shape(tmp_path):
    target = tiny_checkpoint()
    directory, _ = saved_head(tmp_path / "eagle", target, "eagle")
    export_drafter(directory, "vllm", tmp_path / "out", target)
    weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    weights["model.fc.weight"] = weights["model.fc.weight"].T.contiguous()
    save_file(weights, str(tmp_path / "out" / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="model.fc.weight has shape"):
        read_eagle(tmp_path / "out")


@pytest.mark.parametrize("draft_vocab", [None, DRAFT_VOCAB])
def test_exported_eagle3_gives_our_logits_and_keeps_the_draft_vocabulary(tmp_path, draft_vocab):
    """vLLM's Eagle3LlamaForCausalLM, run from the files alone: the same draft logits as our head through the
    engine's LM head (on the draft vocabulary where there is one, -inf elsewhere) and the same fed-back state,
    for a teacher-forced run and for a step fed back its own output."""
    target = tiny_checkpoint()
    model = build_model(target, torch.float32, "cpu", 64, plain=True)      # its weights read below
    layers = default_aux_layers(target.config.num_hidden_layers)
    drafter = DrafterConfig("eagle3", target_signature(target.config, target.tokenizer), draft_vocab=draft_vocab,
                            aux_layers=layers)
    torch.manual_seed(3)
    head = build_head(drafter, target.config)
    for name, param in head.named_parameters():
        torch.nn.init.normal_(param, mean=1.0 if "norm" in name else 0.0, std=0.1)
    directory = save_drafter(tmp_path / "eagle3", head, drafter)
    export = export_drafter(directory, "vllm", tmp_path / "out", target)
    assert export.kind == "eagle3" and not export.notes and '"method": "eagle3"' in export.launch
    config, weights = read_eagle3(tmp_path / "out")
    assert config["eagle_aux_hidden_state_layer_ids"] == layers and weights["d2t"].dtype == torch.int64
    assert config["draft_vocab_size"] == len(draft_vocab or range(target.config.vocab_size))
    assert not any("embed_tokens" in name for name in weights)                       # shared from the target

    generator = torch.Generator().manual_seed(4)
    n, hidden = 9, target.config.hidden_size
    tokens = torch.randint(0, target.config.vocab_size, (n + 1,), generator=generator)
    aux = torch.randn(n, 3 * hidden, generator=generator)
    embeddings = model.embed_tokens(tokens[1:]).float()
    cache = torch.zeros(1, 2, target.config.num_key_value_heads, n + 1, target.config.head_dim)
    with step_metadata(AttentionMetadata(torch.arange(n), [PrefillChunk(0, n)], [])):
        normed, fed = head.step(head.fuse(aux), embeddings, torch.arange(n), cache)
    theirs, their_fed = exported_eagle3_forward(config, weights, aux, embeddings, torch.arange(n), fuse=True)
    ours = normed @ model.lm_head.weight.float().T                                      # [n, vocab]
    rows = torch.tensor(draft_vocab) if draft_vocab else torch.arange(target.config.vocab_size)
    torch.testing.assert_close(theirs[:, rows], ours[:, rows], rtol=1e-4, atol=1e-4)
    assert torch.isinf(theirs).sum() == n * (target.config.vocab_size - len(rows))
    torch.testing.assert_close(their_fed, fed, rtol=1e-4, atol=1e-4)
    # the next draft step: the last pair's output fed back (no fc), as vLLM's later passes do
    with step_metadata(AttentionMetadata(torch.arange(n), [PrefillChunk(0, n)], [])):
        normed2, _ = head.step(fed, embeddings, torch.arange(n), torch.zeros_like(cache))
    theirs2, _ = exported_eagle3_forward(config, weights, their_fed, embeddings, torch.arange(n), fuse=False)
    torch.testing.assert_close(theirs2[:, rows], (normed2 @ model.lm_head.weight.float().T)[:, rows],
                               rtol=1e-4, atol=1e-4)


def test_an_eagle3_head_is_refused_for_sglang_in_one_line(tmp_path):
    target = tiny_checkpoint()
    drafter = DrafterConfig("eagle3", target_signature(target.config, target.tokenizer),
                            aux_layers=default_aux_layers(target.config.num_hidden_layers))
    directory = save_drafter(tmp_path / "eagle3", build_head(drafter, target.config), drafter)
    with pytest.raises(ConfigError, match="cannot export this eagle3 drafter for SGLang") as error:
        export_drafter(directory, "sglang", tmp_path / "out", target)
    assert "\n" not in str(error.value) and not (tmp_path / "out").exists()
