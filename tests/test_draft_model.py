"""draft:PATH: which draft models the engine takes, and the clear error for those it must refuse.

A draft model must share the target's tokenizer (same token -> id map), since draft
token ids are verified as target token ids. Its config's vocab_size may still differ
(checkpoints often pad the embedding matrix): logits past the tokenizer are cut off,
a shorter head is padded with -inf. Architecture and file format may differ too.
"""

import json
from pathlib import Path

import pytest
import torch

from specwise.config import EngineConfig
from specwise.engine.llm_engine import LLMEngine
from specwise.errors import ConfigError, ModelLoadError
from specwise.models.checkpoints.loader import load_checkpoint
from specwise.models.config import ModelConfig
from specwise.sampling_params import SamplingParams
from tiny_checkpoints import TINY_VOCAB_SIZE, make_tiny_hf_config, tiny_tokenizer, write_gguf_checkpoint, \
    write_hf_checkpoint
from tiny_models import random_weights

ENGINE = dict(dtype="float32", num_kv_blocks=128, block_size=4, max_model_len=96, max_num_batched_tokens=256)
PROMPTS = ["def add(a, b):\n    return a + b\n\ndef add(", "The quick brown fox jumps", "x"]
PADDED_VOCAB = 448


def target_weights() -> tuple[dict, dict]:
    config = make_tiny_hf_config()
    return config, random_weights(ModelConfig.from_hf(config), seed=0)


def padded(weights: dict, vocab_size: int, winning: bool) -> dict:
    """The same model with its embedding and head padded to vocab_size rows. `winning`: the head's padding
    rows are large, so padding ids often win the argmax (whenever the hidden state sums positive); else
    they are zero (logit 0, below the peaked real logits)."""
    result = dict(weights)
    embed, head = weights["model.embed_tokens.weight"], weights["lm_head.weight"]
    extra, hidden = vocab_size - embed.shape[0], embed.shape[1]
    result["model.embed_tokens.weight"] = torch.cat([embed, torch.zeros(extra, hidden)])
    fill = 10 * head.abs().max() * torch.ones(extra, hidden) if winning else torch.zeros(extra, hidden)
    result["lm_head.weight"] = torch.cat([head, fill])
    return result


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    config, weights = target_weights()
    return write_hf_checkpoint(tmp_path_factory.mktemp("target"), config, weights)


def greedy(max_tokens: int = 24) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def generate(engine: LLMEngine) -> list[list[int]]:
    request_ids = [engine.add_request(prompt, greedy()) for prompt in PROMPTS]
    finished = {}
    while engine.has_unfinished():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output.output_token_ids
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return [finished[request_id] for request_id in request_ids]


def engine_for(target_path: Path, speculative: str | None = None) -> LLMEngine:
    return LLMEngine(EngineConfig(speculative=speculative, num_speculative_tokens=3, **ENGINE),
                     load_checkpoint(target_path))


@pytest.fixture(scope="module")
def reference(target_dir) -> list[list[int]]:
    return generate(engine_for(target_dir))


def test_a_draft_with_the_same_weights_is_accepted_and_exact(target_dir, reference):
    engine = engine_for(target_dir, f"draft:{target_dir}")
    assert generate(engine) == reference
    assert engine.stats.drafts > 0 and engine.stats.acceptance_rate > 0.9
    assert engine.proposer.kv_cache_bytes > 0


def test_a_draft_with_a_padded_vocab_size_but_the_same_tokenizer_works(target_dir, reference, tmp_path):
    config, weights = target_weights()
    draft_config = {**config, "vocab_size": PADDED_VOCAB}
    draft = write_hf_checkpoint(tmp_path / "draft", draft_config, padded(weights, PADDED_VOCAB, winning=True))
    engine = engine_for(target_dir, f"draft:{draft}")
    assert generate(engine) == reference
    # padding rows often win the draft's raw argmax: high acceptance shows its logits were cut at the tokenizer
    assert engine.stats.acceptance_rate > 0.9


def test_a_draft_smaller_than_a_padded_target_works(reference, tmp_path):
    config, weights = target_weights()
    target = write_hf_checkpoint(tmp_path / "target", {**config, "vocab_size": PADDED_VOCAB},
                                 padded(weights, PADDED_VOCAB, winning=False))
    draft = write_hf_checkpoint(tmp_path / "draft", config, weights)
    plain = generate(engine_for(target))
    assert plain == reference            # zero padding rows never win
    engine = engine_for(target, f"draft:{draft}")
    assert generate(engine) == plain
    assert engine.stats.acceptance_rate > 0.9    # the draft's missing ids are -inf, not a shifted vocabulary


def test_a_target_emitting_ids_past_a_smaller_draft_vocabulary_keeps_working(tmp_path):
    config, weights = target_weights()
    target = write_hf_checkpoint(tmp_path / "target", {**config, "vocab_size": PADDED_VOCAB},
                                 padded(weights, PADDED_VOCAB, winning=True))
    draft = write_hf_checkpoint(tmp_path / "draft", config, weights)
    plain = generate(engine_for(target))
    assert any(token >= TINY_VOCAB_SIZE for output in plain for token in output)   # padding ids emitted
    assert generate(engine_for(target, f"draft:{draft}")) == plain


def test_a_draft_of_another_architecture_with_the_same_tokenizer_works(target_dir, reference, tmp_path):
    config = make_tiny_hf_config("qwen2", num_hidden_layers=1, hidden_size=32, intermediate_size=64)
    draft = write_hf_checkpoint(tmp_path / "qwen2", config, random_weights(ModelConfig.from_hf(config), seed=3))
    engine = engine_for(target_dir, f"draft:{draft}")
    assert generate(engine) == reference
    assert engine.stats.drafts > 0


def test_a_gguf_draft_with_the_same_tokenizer_works(target_dir, reference, tmp_path):
    config, weights = target_weights()
    draft = write_gguf_checkpoint(tmp_path / "draft.gguf", config, weights)
    engine = engine_for(target_dir, f"draft:{draft}")
    assert generate(engine) == reference
    assert engine.stats.acceptance_rate > 0.9


def test_a_draft_with_an_extra_token_is_refused_naming_its_path(target_dir, tmp_path):
    config, weights = target_weights()
    draft = write_hf_checkpoint(tmp_path / "extra", {**config, "vocab_size": PADDED_VOCAB},
                                padded(weights, PADDED_VOCAB, winning=False))
    backend = tiny_tokenizer().from_str(tiny_tokenizer().to_str())
    backend.add_special_tokens(["<|extra|>"])
    backend.save(str(draft / "tokenizer.json"))
    with pytest.raises(ConfigError) as error:
        engine_for(target_dir, f"draft:{draft}")
    message = str(error.value)
    assert str(draft) in message
    assert "vocabulary" in message and str(TINY_VOCAB_SIZE + 1) in message and str(TINY_VOCAB_SIZE) in message


def test_a_draft_with_the_same_vocabulary_size_but_other_ids_is_refused(target_dir, tmp_path):
    config, weights = target_weights()
    draft = write_hf_checkpoint(tmp_path / "swapped", config, weights)
    tokenizer = json.loads(tiny_tokenizer().to_str())
    vocab = tokenizer["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[300:302]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (draft / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ConfigError, match="vocabulary") as error:
        engine_for(target_dir, f"draft:{draft}")
    assert str(draft) in str(error.value)


def test_a_missing_draft_path_is_a_load_error_naming_it(target_dir, tmp_path):
    missing = tmp_path / "no-such-draft"
    with pytest.raises(ModelLoadError) as error:
        engine_for(target_dir, f"draft:{missing}")
    assert str(missing) in str(error.value)


def test_draft_without_a_path_is_a_config_error(target_dir):
    with pytest.raises(ConfigError, match="draft:PATH"):
        engine_for(target_dir, "draft:")
