"""Tokenizer and chat template of a checkpoint, from a HF directory or GGUF metadata, plus streaming detokenization."""

import functools
import json
import warnings
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.sandbox
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers

from specwise.errors import ConfigError, InputError, ModelLoadError

# Pre-tokenizer regexes by `tokenizer.ggml.pre` (the same splits the models' own tokenizer.json files use).
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
GGUF_CONTROL, GGUF_USER_DEFINED, GGUF_BYTE = 3, 4, 6
SPIECE_SPACE = "\u2581"


@dataclass
class Tokenizer:
    backend: tokenizers.Tokenizer
    bos_token_id: int | None
    eos_token_ids: list[int]
    add_bos: bool
    chat_template: str | None
    source: str

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token(self) -> str:
        return "" if self.bos_token_id is None else self.backend.id_to_token(self.bos_token_id)

    @property
    def eos_token(self) -> str:
        return self.backend.id_to_token(self.eos_token_ids[0]) if self.eos_token_ids else ""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None:
            ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    @property
    def template_takes_tools(self) -> bool:
        """Does the chat template read a `tools` variable (so it renders tool definitions itself)?"""
        if not self.chat_template:
            return False
        try:
            return _reads_tools(self.chat_template)
        except jinja2.TemplateError:
            return False

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, **template_vars) -> str:
        if not self.chat_template:
            raise ConfigError(f"{self.source}: the model has no chat template; send a plain prompt instead")
        try:
            template = _compiled_template(self.chat_template)
        except jinja2.TemplateError as e:
            raise ConfigError(f"{self.source}: chat template does not compile: {e}") from None
        try:
            return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                   bos_token=self.bos_token, eos_token=self.eos_token, **template_vars)
        except jinja2.TemplateError as e:
            raise InputError(f"chat template: {one_line(e)}") from None

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **template_vars) -> list[int]:
        text = self.render_chat(messages, add_generation_prompt, **template_vars)
        has_bos = bool(self.bos_token) and text.startswith(self.bos_token)
        return self.encode(text, add_special_tokens=not has_bos)

    @classmethod
    def from_hf_dir(cls, path) -> "Tokenizer":
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise ModelLoadError(path, "no tokenizer.json (tokenizer.model-only SentencePiece is not supported)")
        try:
            backend = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as e:
            raise ModelLoadError(path / "tokenizer.json", f"cannot read tokenizer: {one_line(e)}") from None
        settings = _read_json(path / "tokenizer_config.json")
        generation = _read_json(path / "generation_config.json")
        bos_id = _token_id(backend, settings.get("bos_token"), generation.get("bos_token_id"))
        eos_ids = _as_list(generation.get("eos_token_id"))
        eos_ids += _as_list(_token_id(backend, settings.get("eos_token"), None))
        add_bos = settings.get("add_bos_token")
        if not isinstance(add_bos, bool):
            add_bos = bos_id is not None and backend.encode("a").ids[:1] == [bos_id]
        template = _hf_chat_template(path, settings)
        return cls(backend, bos_id, list(dict.fromkeys(eos_ids)), add_bos, template, str(path))

    @classmethod
    def from_gguf(cls, metadata: Mapping[str, Any], source: str = "GGUF") -> "Tokenizer":
        """From decoded GGUF metadata values (key -> str, number, bool or list)."""
        kind = metadata.get("tokenizer.ggml.model")
        tokens = metadata.get("tokenizer.ggml.tokens")
        if kind is None or tokens is None:
            raise ModelLoadError(source, "no tokenizer in the GGUF metadata (tokenizer.ggml.model/tokens)")
        types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        if kind == "gpt2":
            backend = _byte_level_bpe(tokens, metadata.get("tokenizer.ggml.merges") or [],
                                      metadata.get("tokenizer.ggml.pre", "default"))
        elif kind == "llama":
            backend = _sentencepiece_bpe(tokens, metadata.get("tokenizer.ggml.scores"), types, metadata)
        else:
            raise ModelLoadError(source, f"GGUF tokenizer model {kind!r} is not supported (only gpt2 and llama)")
        backend.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                    for token, token_type in zip(tokens, types) if token_type == GGUF_CONTROL])
        backend.add_tokens([AddedToken(token, special=False, normalized=False)
                            for token, token_type in zip(tokens, types) if token_type == GGUF_USER_DEFINED])
        eos_ids = [metadata.get(f"tokenizer.ggml.{key}_token_id") for key in ("eos", "eot", "eom")]
        return cls(backend=backend, bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
                   eos_token_ids=list(dict.fromkeys(i for i in eos_ids if i is not None)),
                   add_bos=metadata.get("tokenizer.ggml.add_bos_token", kind == "llama"),
                   chat_template=metadata.get("tokenizer.chat_template"), source=source)


class IncrementalDetokenizer:
    """Feeds token ids, returns the new text. Never emits a partial UTF-8 character (text ending in U+FFFD is
    held back); keeps the spaces that byte-level BPE and SentencePiece put inside tokens (decodes a window of
    prior tokens with the new ones and takes the difference)."""

    # Worked example (SentencePiece): "▁world" decodes alone to "world" but after "Hello" to " world", so the
    # new text is decode(window + new) minus decode(window), where the window is the last few tokens already shown.
    CONTEXT_TOKENS = 5

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int] | None = None):
        self.tokenizer = tokenizer
        self.token_ids = list(prompt_token_ids or [])
        self.read_offset = len(self.token_ids)
        self.prefix_offset = max(self.read_offset - self.CONTEXT_TOKENS, 0)
        self.text = ""

    def add(self, new_token_ids: list[int]) -> str:
        self.token_ids.extend(new_token_ids)
        prefix_text = self.tokenizer.decode(self.token_ids[self.prefix_offset:self.read_offset])
        full_text = self.tokenizer.decode(self.token_ids[self.prefix_offset:])
        if len(full_text) <= len(prefix_text) or full_text.endswith("\ufffd"):
            return ""
        new_text = full_text[len(prefix_text):]
        self.prefix_offset = max(self.read_offset, len(self.token_ids) - self.CONTEXT_TOKENS)
        self.read_offset = len(self.token_ids)
        self.text += new_text
        return new_text


def _byte_level_bpe(tokens: list[str], merges: list[str], pre: str) -> tokenizers.Tokenizer:
    vocab = {token: i for i, token in enumerate(tokens)}
    pairs = [tuple(merge.split(" ", 1)) for merge in merges]
    backend = tokenizers.Tokenizer(models.BPE(vocab, pairs, ignore_merges=pre in ("llama-bpe", "llama3", "llama-v3")))
    backend.pre_tokenizer = _byte_level_pre_tokenizer(pre)
    if pre == "qwen2":
        backend.normalizer = normalizers.NFC()
    backend.decoder = decoders.ByteLevel()
    return backend


def _byte_level_pre_tokenizer(pre: str):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre in ("llama-bpe", "llama3", "llama-v3", "qwen2"):
        split = QWEN2_SPLIT if pre == "qwen2" else LLAMA3_SPLIT
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"), byte_level])
    if pre not in ("default", "gpt2"):
        warnings.warn(f"GGUF pre-tokenizer {pre!r} is not known; splitting text as GPT-2 does", stacklevel=3)
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _sentencepiece_bpe(tokens: list[str], scores: list[float] | None, types: list[int],
                       metadata: Mapping[str, Any]) -> tokenizers.Tokenizer:
    """SentencePiece BPE as a byte-fallback BPE: the pair whose merged piece scores highest merges first."""
    scores = scores or [-float(i) for i in range(len(tokens))]
    vocab = {token: i for i, token in enumerate(tokens)}
    mergeable = {t for t, kind in zip(tokens, types) if kind == 1}
    ranked = []
    for piece in mergeable:
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[vocab[piece]], vocab[left], vocab[right], left, right))
    merges = [(left, right) for *_, left, right in sorted(ranked)]
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id", 0)
    bpe = models.BPE(vocab, merges, unk_token=tokens[unk_id], byte_fallback=True, fuse_unk=True)
    backend = tokenizers.Tokenizer(bpe)
    prefix = metadata.get("tokenizer.ggml.add_space_prefix", True)
    backend.pre_tokenizer = pre_tokenizers.Metaspace(SPIECE_SPACE, prepend_scheme="first" if prefix else "never",
                                                     split=False)
    steps = [decoders.Replace(SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return backend


def _hf_chat_template(path: Path, settings: dict) -> str | None:
    """tokenizer_config.json's chat_template (a string, or named templates of which we take "default"),
    else a chat_template.jinja file."""
    template = settings.get("chat_template")
    if isinstance(template, list):
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text()
    return template


# A template compiles once per process (2 ms for SmolLM2's, on every chat request before; rendering a
# compiled template takes ~0.1 ms and is thread-safe). Errors are not cached: a bad template raises each time.
@functools.lru_cache(maxsize=8)
def _compiled_template(text: str) -> jinja2.Template:
    return _jinja_env().from_string(text)


@functools.lru_cache(maxsize=8)
def _reads_tools(text: str) -> bool:
    return "tools" in jinja2.meta.find_undeclared_variables(_jinja_env().parse(text))


def _jinja_env() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = _raise_template_error
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _raise_template_error(message: str):
    raise InputError(f"chat template: {message}")


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (ValueError, OSError) as e:
        raise ModelLoadError(path, f"not valid JSON: {one_line(e)}") from None


def _token_id(backend: tokenizers.Tokenizer, token, fallback: int | None) -> int | None:
    if isinstance(token, dict):
        token = token.get("content")
    token_id = backend.token_to_id(token) if isinstance(token, str) else None
    return fallback if token_id is None else token_id


def _as_list(value) -> list[int]:
    return [] if value is None else [value] if isinstance(value, int) else list(value)


def one_line(error: Exception) -> str:
    return " ".join(str(error).split()) or type(error).__name__
