import json

import pytest

from specwise.errors import ConfigError, InputError, ModelLoadError
from specwise.models.checkpoints.gguf import open_gguf, read_metadata
from specwise.models.tokenizer import IncrementalDetokenizer, Tokenizer
from tiny_checkpoints import (CHATML_TEMPLATE, make_tiny_hf_config, random_state_dict,  # noqa: F401 (fixture)
                              real_model_path, tiny_gguf_tokenizer_metadata, write_hf_checkpoint)

TEXTS = [
    "Hello world",
    "def add(a, b):\n    return a + b\n",
    "  leading spaces,\ttabs\n\n\nand blank lines  ",
    "Numbers 12345 and 3.14159, dates 2024-06-01",
    "Unicode: café, Zürich, 東京, 🙂😀, naïve — done.",
    "She said \"it's what they'll do, isn't it?\"",
]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


@pytest.fixture
def hf_dir(tmp_path):
    hf_config = make_tiny_hf_config("llama")
    return write_hf_checkpoint(tmp_path, hf_config, random_state_dict(hf_config))


def sentencepiece_metadata() -> dict:
    """A hand-made SentencePiece vocabulary: merged pieces score higher the earlier they merge."""
    pieces = {"▁": -100, "h": -100, "e": -100, "l": -100, "o": -100, "w": -100, "r": -100, "d": -100,
              "he": -1, "ll": -2, "llo": -3, "hello": -4, "▁hello": -5, "▁w": -6, "or": -7, "ld": -8,
              "orld": -9, "▁world": -10}
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(pieces)
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [0.0] * 259 + list(pieces.values()),
            "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * len(pieces),
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0}


def test_hf_tokenizer_settings(hf_dir):
    tokenizer = Tokenizer.from_hf_dir(hf_dir)
    assert (tokenizer.vocab_size, tokenizer.bos_token_id, tokenizer.eos_token_ids) == (400, 1, [2])
    assert tokenizer.add_bos is False and tokenizer.chat_template == CHATML_TEMPLATE


@pytest.mark.parametrize("text", TEXTS)
def test_hf_tokenizer_round_trips(hf_dir, text):
    tokenizer = Tokenizer.from_hf_dir(hf_dir)
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_special_tokens_in_text_are_single_ids_and_skipped_on_decode(hf_dir):
    tokenizer = Tokenizer.from_hf_dir(hf_dir)
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tokenizer.decode(ids) == "user\nhi"
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"


def test_add_bos_and_generation_config_eos(hf_dir):
    settings = json.loads((hf_dir / "tokenizer_config.json").read_text())
    settings |= {"add_bos_token": True, "chat_template": "{{ bos_token }}" + CHATML_TEMPLATE}
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(settings))
    (hf_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2]}))
    tokenizer = Tokenizer.from_hf_dir(hf_dir)
    assert tokenizer.eos_token_ids == [0, 2]
    assert tokenizer.encode("Hello")[0] == 1 and tokenizer.encode("Hello", add_special_tokens=False)[0] != 1
    ids = tokenizer.apply_chat_template(MESSAGES)
    assert ids[:2] == [1, 1] and ids[2] != 1   # the template's BOS, then <|im_start|> (also id 1); no extra BOS


def test_chat_template_file_is_used_when_config_has_none(hf_dir):
    settings = json.loads((hf_dir / "tokenizer_config.json").read_text())
    del settings["chat_template"]
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(settings))
    (hf_dir / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert Tokenizer.from_hf_dir(hf_dir).render_chat(MESSAGES) == "Be brief."


def test_chat_template_renders_and_encodes(hf_dir):
    tokenizer = Tokenizer.from_hf_dir(hf_dir)
    rendered = tokenizer.render_chat(MESSAGES)
    assert rendered == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                        "<|im_start|>assistant\n")
    ids = tokenizer.apply_chat_template(MESSAGES)
    assert ids == tokenizer.encode(rendered)
    assert tokenizer.decode(ids, skip_special_tokens=False) == rendered
    assert not tokenizer.render_chat(MESSAGES, add_generation_prompt=False).endswith("assistant\n")


def test_chat_template_errors_are_clear(hf_dir):
    tokenizer = Tokenizer.from_hf_dir(hf_dir)
    tokenizer.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(InputError, match="^chat template: roles must alternate$"):
        tokenizer.apply_chat_template(MESSAGES)
    tokenizer.chat_template = None
    with pytest.raises(ConfigError, match="has no chat template"):
        tokenizer.apply_chat_template(MESSAGES)


def test_hf_dir_without_tokenizer_json(hf_dir):
    (hf_dir / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="no tokenizer.json"):
        Tokenizer.from_hf_dir(hf_dir)


@pytest.mark.parametrize("pre", ["gpt2", "smollm"])
def test_gguf_byte_level_tokenizer_matches_the_hf_tokenizer(hf_dir, pre):
    from tiny_checkpoints import tiny_tokenizer

    gguf_tokenizer = Tokenizer.from_gguf(tiny_gguf_tokenizer_metadata(pre))
    reference = tiny_tokenizer(digits_split=pre == "smollm")
    for text in TEXTS + ["<|im_start|>user\n12345<|im_end|>"]:
        assert gguf_tokenizer.encode(text) == reference.encode(text).ids, text
        assert gguf_tokenizer.decode(gguf_tokenizer.encode(text)) == reference.decode(reference.encode(text).ids)
    assert (gguf_tokenizer.bos_token_id, gguf_tokenizer.eos_token_ids, gguf_tokenizer.add_bos) == (1, [2], False)


@pytest.mark.parametrize("pre, pieces", [
    ("smollm", ["Ġx", "1", "2", "3", "4", "5", "Ġ", "6"]),
    ("qwen2", ["Ġx", "1", "2", "3", "4", "5", "Ġ", "6"]),
    ("llama-bpe", ["Ġx", "123", "45", "Ġ", "6"]),
    ("gpt2", ["Ġx", "12345", "Ġ6"]),
])
def test_gguf_pre_tokenizer_splits_digits_like_the_model_family(pre, pieces):
    tokenizer = Tokenizer.from_gguf(tiny_gguf_tokenizer_metadata(pre))
    assert [piece for piece, _ in tokenizer.backend.pre_tokenizer.pre_tokenize_str(" x12345 6")] == pieces
    assert tokenizer.decode(tokenizer.encode(" x12345 6")) == " x12345 6"


def test_gguf_unknown_pre_tokenizer_warns_and_splits_like_gpt2():
    with pytest.warns(UserWarning, match="'mystery' is not known"):
        tokenizer = Tokenizer.from_gguf(tiny_gguf_tokenizer_metadata("mystery"))
    reference = Tokenizer.from_gguf(tiny_gguf_tokenizer_metadata("gpt2"))
    assert tokenizer.encode(TEXTS[3]) == reference.encode(TEXTS[3])


def test_gguf_tokenizer_problems_are_model_load_errors():
    with pytest.raises(ModelLoadError, match="^m.gguf: GGUF tokenizer model 'bert' is not supported"):
        Tokenizer.from_gguf(tiny_gguf_tokenizer_metadata() | {"tokenizer.ggml.model": "bert"}, source="m.gguf")
    with pytest.raises(ModelLoadError, match="no tokenizer in the GGUF metadata"):
        Tokenizer.from_gguf({"general.architecture": "llama"})


def test_sentencepiece_gguf_tokenizer_merges_by_score_and_falls_back_to_bytes():
    tokenizer = Tokenizer.from_gguf(sentencepiece_metadata())
    vocab = tokenizer.backend.get_vocab()
    assert tokenizer.encode("hello world") == [1, vocab["▁hello"], vocab["▁world"]]
    assert tokenizer.decode(tokenizer.encode("hello world")) == "hello world"
    ids = tokenizer.encode("hé", add_special_tokens=False)
    assert ids == [vocab["▁"], vocab["h"], vocab["<0xC3>"], vocab["<0xA9>"]]
    assert tokenizer.decode(ids) == "hé"


def test_incremental_detokenizer_keeps_the_space_before_a_word():
    tokenizer = Tokenizer.from_gguf(sentencepiece_metadata())
    vocab = tokenizer.backend.get_vocab()
    assert tokenizer.decode([vocab["▁world"]]) == "world"
    stream = IncrementalDetokenizer(tokenizer, prompt_token_ids=[1, vocab["▁hello"]])
    assert stream.add([vocab["▁world"]]) == " world"
    assert stream.add([vocab["<0xC3>"]]) == ""        # half of "é": held back
    assert stream.add([vocab["<0xA9>"], 2]) == "é"     # EOS is special: not shown
    assert stream.text == " worldé"


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenizer_streams_byte_level_text_exactly(hf_dir, text):
    tokenizer = Tokenizer.from_hf_dir(hf_dir)
    prompt = tokenizer.encode("Prompt: ")
    stream = IncrementalDetokenizer(tokenizer, prompt_token_ids=prompt)
    pieces = [stream.add([token]) for token in tokenizer.encode(text)]
    assert "".join(pieces) == stream.text == text
    assert not any("\ufffd" in piece for piece in pieces)


@pytest.mark.integration
def test_default_model_tokenizer(real_model_path):
    tokenizer = Tokenizer.from_gguf(read_metadata(open_gguf(real_model_path), real_model_path))
    assert (tokenizer.vocab_size, tokenizer.bos_token_id, tokenizer.eos_token_ids) == (49152, 1, [2])
    assert [tokenizer.decode([t]) for t in tokenizer.encode("12345")] == ["1", "2", "3", "4", "5"]
    for text in TEXTS:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.render_chat([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])[:3] == [1, 9690, 198]


@pytest.mark.integration
@pytest.mark.slow
def test_default_model_tokenizer_matches_transformers(real_model_path):
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoTokenizer.from_pretrained(real_model_path.parent, gguf_file=real_model_path.name)
    tokenizer = Tokenizer.from_gguf(read_metadata(open_gguf(real_model_path), real_model_path))
    for text in TEXTS + ["<|im_start|>user\nx = [1, 22, 333]<|im_end|>"]:
        assert tokenizer.encode(text) == reference.encode(text), text
