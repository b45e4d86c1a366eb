"""Structured output: a grammar per request, as a token mask, through llguidance.

Definitions:
  - grammar: what the output text must follow (a JSON schema, any JSON object, a regex, one of a
    list of strings, or a Lark grammar), compiled once per distinct `StructuredOutput`.
  - matcher: one request's position in its grammar; it has consumed exactly the request's
    output tokens (`accept` after every step, never anything else between steps).
  - mask: the tokens the grammar allows next ([vocab_size] bool); end-of-sequence is allowed
    where the grammar may end, and is the only token allowed once it must end.
  - forced tokens: where the grammar leaves one choice (`"}` closing an object, a key name),
    `forced_tokens()` returns them; the engine proposes them as free drafts.

Speculation: the mask at draft position j is the matcher's after drafts 0..j-1 (`masks` consumes
them, computes, and rolls back), so the verifier sees exactly the distribution plain decoding
would; `valid_prefix` truncates a proposal at its first draft the grammar rejects.

Why llguidance (measured on SmolLM2's 49,152-token vocabulary, a nested JSON schema, 2-core CPU):
a mask costs ~10-20 us per token warm (xgrammar ~3-5 us, outlines-core needs a full index
built per schema), both far below one target forward (~40 ms). llguidance has no
dependencies (xgrammar pulls triton, ~290 MB, and transformers), builds straight from the
`tokenizers` JSON our loaders make (GGUF included), and has the calls speculation needs
(validate_tokens, rollback, compute_ff_tokens).

Worked example (JSON schema {"type": "object", "properties": {"ok": {"type": "boolean"}},
"required": ["ok"]}, compact separators): after no tokens only `{` is allowed and
`{"ok":` is forced; after `{"ok":` the mask allows `t`/`true` and `f`/`false` tokens.
"""

import collections
import json
import threading

import llguidance
import torch

from specwise.errors import InputError
from specwise.models.tokenizer import Tokenizer
from specwise.sampling_params import StructuredOutput

# JSON output keeps json.dumps' separators and no other whitespace: free whitespace lets a model
# pad forever, and these are the separators models have seen most.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_GRAMMAR_SIZE = 500_000        # llguidance's own size measure; larger grammars are refused (400)
MAX_CACHED_GRAMMARS = 256         # compiled grammars kept, least recently used dropped: a server that runs for
                                  # days sees endless distinct schemas, and each is kept as its grammar text
ANY_JSON_OBJECT = {"type": "object"}


def grammar_text(spec: StructuredOutput) -> str:
    """The llguidance grammar of a structured-output request; InputError names what is wrong."""
    try:
        if spec.kind == "json":
            return llguidance.LLMatcher.grammar_from_json_schema(json.loads(spec.value), defaults=JSON_OPTIONS)
        if spec.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema(ANY_JSON_OBJECT, defaults=JSON_OPTIONS)
        if spec.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(spec.value)
        if spec.kind == "choice":
            choices = json.loads(spec.value)
            if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
                raise ValueError("choice must be a non-empty list of non-empty strings")
            return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))
        return llguidance.LLMatcher.grammar_from_lark(spec.value)
    except (ValueError, TypeError) as error:
        raise InputError(f"{spec.kind} grammar: {error}") from None


class GrammarCompiler:
    """Compiles structured-output requests for one tokenizer; the llguidance tokenizer (about a
    second for a 50k vocabulary) is built on first use, and the last MAX_CACHED_GRAMMARS compiled
    grammars are cached."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size            # the model's (may exceed the tokenizer's: padding)
        self.limits = llguidance.LLParserLimits(max_grammar_size=MAX_GRAMMAR_SIZE)
        self._lltokenizer = None
        self._lock = threading.Lock()
        self._checked: collections.OrderedDict[StructuredOutput, str] = collections.OrderedDict()
        self._checked_lock = threading.Lock()

    @property
    def lltokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._lltokenizer is None:
                self._lltokenizer = llguidance.LLTokenizer(self.tokenizer.backend.to_str(),
                                                           eos_token=list(self.tokenizer.eos_token_ids))
            return self._lltokenizer

    def check(self, spec: StructuredOutput) -> str:
        """The compiled grammar text; InputError (the server's 400) when it does not compile (any thread)."""
        with self._checked_lock:
            if spec in self._checked:
                self._checked.move_to_end(spec)
                return self._checked[spec]
        grammar = grammar_text(spec)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.lltokenizer)
        if is_error:
            raise InputError(f"{spec.kind} grammar: {messages[0] if messages else 'invalid'}")
        matcher = llguidance.LLMatcher(self.lltokenizer, grammar, log_level=0, limits=self.limits)
        if matcher.is_error():
            raise InputError(f"{spec.kind} grammar: {matcher.get_error()}")
        with self._checked_lock:
            self._checked[spec] = grammar
            while len(self._checked) > MAX_CACHED_GRAMMARS:
                self._checked.popitem(last=False)
        return grammar

    @property
    def num_cached(self) -> int:
        return len(self._checked)

    def matcher(self, spec: StructuredOutput) -> "GrammarMatcher":
        grammar = self.check(spec)
        lltokenizer = self.lltokenizer
        return GrammarMatcher(llguidance.LLMatcher(lltokenizer, grammar, log_level=0, limits=self.limits),
                              lltokenizer.vocab_size, self.vocab_size)


class GrammarMatcher:
    """One request's matcher; see the module docstring for what it has consumed."""

    def __init__(self, matcher: llguidance.LLMatcher, tokenizer_vocab_size: int, vocab_size: int):
        self.matcher = matcher
        self.vocab_size = vocab_size            # the model's; the bitmask covers the tokenizer's
        self.bitmask = torch.full((1, (tokenizer_vocab_size + 31) // 32), -1, dtype=torch.int32)

    def accept(self, token_ids: list[int]) -> None:
        """Consume emitted tokens. A token the grammar forbids can come only from a request that
        ends anyway (max_tokens, a stop string); the matcher then stops constraining."""
        if not self.matcher.is_stopped():
            self.matcher.consume_tokens(token_ids)

    def valid_prefix(self, token_ids: list[int]) -> int:
        """How many of token_ids, in order, the grammar allows from here."""
        if self.matcher.is_error():
            return len(token_ids)
        return self.matcher.validate_tokens(token_ids)

    def forced_after(self, drafts: list[int]) -> list[int]:
        """The tokens the grammar forces after drafts (taken as accepted); [] if none."""
        if self.matcher.is_error() or self.matcher.is_stopped():
            return []
        consumed = self.matcher.try_consume_tokens(drafts) if drafts else 0
        forced = self.matcher.compute_ff_tokens() if consumed == len(drafts) else []
        if consumed:
            self.matcher.rollback(consumed)
        return forced

    def masks(self, drafts_before: list[list[int]]) -> torch.Tensor:
        """[len(drafts_before), vocab_size] bool: allowed tokens after each list of drafts (as if accepted)."""
        rows = torch.ones(len(drafts_before), self.vocab_size, dtype=torch.bool)
        if self.matcher.is_error():
            return rows
        for row, drafts in enumerate(drafts_before):
            consumed = self.matcher.try_consume_tokens(drafts) if drafts else 0
            if consumed == len(drafts):
                words = self.bitmask[0]
                self.matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * words.element_size())
                rows[row] = unpack_bitmask(self.bitmask[0], self.vocab_size)
            if consumed:
                self.matcher.rollback(consumed)
        return rows


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 words, bit b of word w = token 32 w + b -> [vocab_size] bool (tokens past the
    tokenizer's vocabulary, model padding, are not allowed)."""
    bits = torch.arange(32, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(1) >> bits) & 1).bool().view(-1)        # [32 * words]
    if allowed.numel() >= vocab_size:
        return allowed[:vocab_size]
    return torch.cat([allowed, torch.zeros(vocab_size - allowed.numel(), dtype=torch.bool)])
