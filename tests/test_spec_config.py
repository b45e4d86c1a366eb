"""`--speculative` parsing and validation."""

import pytest

from specwise.errors import ConfigError
from specwise.engine.spec_decode.config import SpeculativeConfig


def test_off_when_absent_or_none():
    assert SpeculativeConfig.parse(None, 4) is None
    assert SpeculativeConfig.parse("none", 4) is None
    assert SpeculativeConfig.parse(" Off ", 4) is None


def test_plain_ngram_uses_sizes_2_to_4():
    config = SpeculativeConfig.parse("ngram", 5)
    assert (config.method, config.num_speculative_tokens) == ("ngram", 5)
    assert (config.ngram_min_n, config.ngram_max_n) == (2, 4)


def test_ngram_sizes():
    config = SpeculativeConfig.parse("ngram:1-3", 4)
    assert (config.ngram_min_n, config.ngram_max_n) == (1, 3)
    config = SpeculativeConfig.parse("NGRAM:3", 4)
    assert (config.ngram_min_n, config.ngram_max_n) == (3, 3)


def test_draft_model_path_keeps_its_colons():
    config = SpeculativeConfig.parse("draft:/models/small:v2", 3)
    assert (config.method, config.draft_model) == ("draft", "/models/small:v2")


def test_layer_skip():
    config = SpeculativeConfig.parse("layer_skip:8", 4)
    assert (config.method, config.layer_skip_layers) == ("layer_skip", 8)
    config.check_num_layers(30)
    with pytest.raises(ConfigError, match="below the target's 8 layers"):
        config.check_num_layers(8)


@pytest.mark.parametrize("text", ["ngram", "ngram:1-3", "draft:/a/b", "layer_skip:6", "eagle", "medusa:/a/b"])
def test_label_round_trips(text):
    config = SpeculativeConfig.parse(text, 4)
    assert SpeculativeConfig.parse(config.label, 4) == config


@pytest.mark.parametrize("text, k, message", [
    ("tree", 4, "unknown speculative method 'tree'"),
    ("", 4, "unknown speculative method ''"),
    ("ngram:3-2", 4, "1 <= MIN <= MAX"),
    ("ngram:0-2", 4, "1 <= MIN <= MAX"),
    ("ngram:two", 4, "ngram:MIN-MAX"),
    ("ngram:", 4, "ngram:MIN-MAX"),
    ("draft", 4, "draft:PATH"),
    ("draft:", 4, "draft:PATH"),
    ("layer_skip", 4, "whole number"),
    ("layer_skip:-1", 4, "whole number"),
    ("layer_skip:0", 4, "L >= 1"),
    ("ngram", 0, "num_speculative_tokens must be in 1..16"),
    ("ngram", 17, "num_speculative_tokens must be in 1..16"),
])
def test_bad_values_give_one_line_config_errors(text, k, message):
    with pytest.raises(ConfigError, match=message) as raised:
        SpeculativeConfig.parse(text, k)
    assert "\n" not in str(raised.value)


def test_fields_of_another_method_are_rejected():
    with pytest.raises(ConfigError):
        SpeculativeConfig("ngram", 4, draft_model="/a")
    with pytest.raises(ConfigError):
        SpeculativeConfig("draft", 4, draft_model="/a", layer_skip_layers=2)
