"""Which drafter to use, parsed from the `--speculative` text.

    ngram               n-gram prompt lookup, sizes 2..4 (see specwise/engine/spec_decode/ngram.py)
    ngram:MIN-MAX       n-gram sizes MIN..MAX, e.g. ngram:1-3
    ngram:N             n-gram size N only
    draft:PATH          a smaller model with the target's tokenizer (HF directory or GGUF file)
    layer_skip:L        the target's own first L layers plus its final norm and head
    suffix              suffix decoding: the request's own text and a cache of earlier responses
                        (see specwise/engine/spec_decode/suffix.py), matches up to 24 tokens deep
    suffix:D            matches up to D tokens deep, e.g. suffix:32
    suffix:D:T          and a global cache of at most T tokens; suffix:24:0 turns the cache off
    lookahead           lookahead decoding (see specwise/engine/spec_decode/lookahead.py): a Jacobi
                        window of W columns x N-1 levels and up to G candidate N-grams, verified in
                        the same forward
    lookahead:W,N,G     those sizes, e.g. lookahead:1,3,2 (the default; W 0 turns the Jacobi window off)
    eagle               an EAGLE head over the target's features: the built-in one trained for the
                        target (specwise/models/heads/, see specwise/models/heads/builtin.py)
    eagle:DIR           the EAGLE head in DIR (written by `specwise train-drafter --kind eagle`)
    eagle3:DIR          the EAGLE-3 head in DIR (`train-drafter --kind eagle3`: three of the target's
                        layers fused; none is built in)
    medusa, medusa:DIR  Medusa heads, built in or from DIR (k at most their number of heads)
    none / off          no speculation (same as leaving the flag out)

k (`--num-speculative-tokens`) is the most draft tokens per sequence per step, at most
MAX_SPECULATIVE_TOKENS (the one k bound, in specwise/config.py). For lookahead k is the
longest prompt-lookup candidate (as for ngram); a step feeds up to (W + G)(N - 1) + max(0, k -
(N - 1)) rows after the last token (`step_rows`), and the k policies choose among those (a
smaller budget shrinks W and G). This module is torch-free,
so calc and bench import it.
The draft path is only checked for text here; the loader reports a missing file.
"""

import re
from dataclasses import dataclass

from specwise.config import MAX_SPECULATIVE_TOKENS
from specwise.errors import ConfigError

METHODS = ("ngram", "draft", "layer_skip", "suffix", "lookahead", "eagle", "eagle3", "medusa")
HEAD_METHODS = ("eagle", "eagle3", "medusa")      # drafting heads over the target's features; DIR optional
DEFAULT_MIN_N, DEFAULT_MAX_N = 2, 4     # n-gram sizes of plain `ngram` (why: engine/spec_decode/ngram.py)
DEFAULT_SUFFIX_DEPTH = 24               # suffix: longest match considered (vLLM's default tree depth)
DEFAULT_SUFFIX_CACHE_TOKENS = 200_000   # suffix: global cache bound in tokens (<= ~600 bytes each, about 120 MB)
# lookahead: W, N, G measured by benchmarks/lookahead_speedup.py (SmolLM2-135M, bf16, 1 thread, suite at
# concurrency 1, k 4): tokens/s over off, geometric mean of 6 categories, 2,3,2 1.66x, 1,3,2 1.73x (best with a
# Jacobi window), 0,3,2 1.81x (no window: its rows cost more than they add on a CPU), ngram 1.51x
DEFAULT_LOOKAHEAD_WINDOW, DEFAULT_LOOKAHEAD_NGRAM, DEFAULT_LOOKAHEAD_CANDIDATES = 1, 3, 2
LOOKAHEAD_WINDOW_RANGE, LOOKAHEAD_NGRAM_RANGE, LOOKAHEAD_CANDIDATES_RANGE = (0, 16), (2, 6), (1, 16)
FORMS = ("ngram, ngram:MIN-MAX, draft:PATH, layer_skip:L, suffix[:DEPTH[:CACHE_TOKENS]], lookahead[:W,N,G], "
         "eagle[:DIR], eagle3:DIR or medusa[:DIR]")
_NGRAM_SIZES = re.compile(r"(\d+)(?:-(\d+))?")
_LOOKAHEAD_SIZES = re.compile(r"(\d+),(\d+),(\d+)")
_SUFFIX_ARGUMENT = re.compile(r"(\d+)(?::(\d+))?")


@dataclass
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int = 4
    ngram_min_n: int = DEFAULT_MIN_N
    ngram_max_n: int = DEFAULT_MAX_N
    draft_model: str | None = None      # draft: path of the draft model
    layer_skip_layers: int | None = None  # layer_skip: how many of the target's first layers draft
    suffix_max_depth: int = DEFAULT_SUFFIX_DEPTH               # suffix: longest match, tokens
    suffix_cache_tokens: int = DEFAULT_SUFFIX_CACHE_TOKENS     # suffix: global cache bound, 0 = off
    head_dir: str | None = None         # eagle / medusa: the head's directory; None = the built-in one
    lookahead_window: int = DEFAULT_LOOKAHEAD_WINDOW           # lookahead: W, Jacobi window columns
    lookahead_ngram: int = DEFAULT_LOOKAHEAD_NGRAM             # lookahead: N, n-gram size (N-1 levels)
    lookahead_candidates: int = DEFAULT_LOOKAHEAD_CANDIDATES   # lookahead: G, candidates verified per step

    def __post_init__(self):
        if self.method not in METHODS:
            raise ConfigError(f"unknown speculative method {self.method!r}; use {FORMS}")
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(f"num_speculative_tokens must be in 1..{MAX_SPECULATIVE_TOKENS} with speculative "
                              f"decoding on, got {self.num_speculative_tokens}")
        if not 1 <= self.ngram_min_n <= self.ngram_max_n:
            raise ConfigError(f"n-gram sizes need 1 <= MIN <= MAX, got ngram:{self.ngram_min_n}-{self.ngram_max_n}")
        if self.method == "draft" and not self.draft_model:
            raise ConfigError("the draft method needs the draft model's path: draft:PATH")
        if self.method != "draft" and self.draft_model is not None:
            raise ConfigError(f"a draft model path is only used by draft:PATH, not by {self.method}")
        if self.method == "layer_skip" and (self.layer_skip_layers is None or self.layer_skip_layers < 1):
            raise ConfigError(f"layer_skip:L needs L >= 1 (how many first layers draft), got {self.layer_skip_layers}")
        if self.method != "layer_skip" and self.layer_skip_layers is not None:
            raise ConfigError(f"a layer count is only used by layer_skip:L, not by {self.method}")
        if self.method not in HEAD_METHODS and self.head_dir is not None:
            raise ConfigError(f"a head directory is only used by eagle:DIR, eagle3:DIR or medusa:DIR, not by "
                              f"{self.method}")
        if self.suffix_max_depth < 2:
            raise ConfigError(f"suffix:D needs a match depth D >= 2, got {self.suffix_max_depth}")
        if self.suffix_cache_tokens < 0:
            raise ConfigError(f"suffix:D:T needs a cache size T >= 0 tokens, got {self.suffix_cache_tokens}")
        check_lookahead_sizes(self.lookahead_window, self.lookahead_ngram, self.lookahead_candidates)

    @classmethod
    def parse(cls, text: str | None, k: int) -> "SpeculativeConfig | None":
        """`--speculative` text and k -> config, or None when speculation is off."""
        if text is None or text.strip().lower() in ("none", "off"):
            return None
        method, has_argument, argument = text.strip().partition(":")
        method = method.strip().lower()
        argument = argument.strip()
        if method == "ngram":
            if not has_argument:
                return cls("ngram", k)
            min_n, max_n = _parse_ngram_sizes(argument)
            return cls("ngram", k, ngram_min_n=min_n, ngram_max_n=max_n)
        if method == "draft":
            return cls("draft", k, draft_model=argument or None)
        if method == "layer_skip":
            if not argument.isdigit():
                raise ConfigError(f"layer_skip:L needs a whole number of layers L, got {text.strip()!r}")
            return cls("layer_skip", k, layer_skip_layers=int(argument))
        if method in HEAD_METHODS:
            return cls(method, k, head_dir=argument or None)
        if method == "suffix":
            if not has_argument:
                return cls("suffix", k)
            depth, cache_tokens = _parse_suffix_argument(argument)
            return cls("suffix", k, suffix_max_depth=depth, suffix_cache_tokens=cache_tokens)
        if method == "lookahead":
            if not has_argument:
                return cls("lookahead", k)
            window, ngram, candidates = _parse_lookahead_sizes(argument)
            return cls("lookahead", k, lookahead_window=window, lookahead_ngram=ngram,
                       lookahead_candidates=candidates)
        raise ConfigError(f"unknown speculative method {text.strip()!r}; use {FORMS}")

    @property
    def step_rows(self) -> int:
        """Rows a full step feeds per sequence after its last token: k, or lookahead's
        (W + G)(N - 1) + max(0, k - (N - 1)) (its prompt lookup candidate may be k long)."""
        if self.method == "lookahead":
            return lookahead_rows(self.lookahead_window, self.lookahead_ngram, self.lookahead_candidates,
                                  self.num_speculative_tokens)
        return self.num_speculative_tokens

    @property
    def label(self) -> str:
        """Canonical `--speculative` text, e.g. ngram:2-4; parse(label, k) gives this config back."""
        if self.method == "ngram":
            return f"ngram:{self.ngram_min_n}-{self.ngram_max_n}"
        if self.method == "draft":
            return f"draft:{self.draft_model}"
        if self.method == "suffix":
            return f"suffix:{self.suffix_max_depth}:{self.suffix_cache_tokens}"
        if self.method in HEAD_METHODS:
            return self.method if self.head_dir is None else f"{self.method}:{self.head_dir}"
        if self.method == "lookahead":
            return f"lookahead:{self.lookahead_window},{self.lookahead_ngram},{self.lookahead_candidates}"
        return f"layer_skip:{self.layer_skip_layers}"

    def check_num_layers(self, num_layers: int) -> None:
        """Once the target is loaded: layer_skip:L must leave at least one layer out."""
        if self.method == "layer_skip" and self.layer_skip_layers >= num_layers:
            raise ConfigError(f"layer_skip:{self.layer_skip_layers} must be below the target's "
                              f"{num_layers} layers")


def _parse_ngram_sizes(argument: str) -> tuple[int, int]:
    match = _NGRAM_SIZES.fullmatch(argument)
    if match is None:
        raise ConfigError(f"n-gram sizes must look like ngram:MIN-MAX or ngram:N, e.g. ngram:2-4, got ngram:{argument}")
    min_n = int(match.group(1))
    max_n = int(match.group(2)) if match.group(2) is not None else min_n
    return min_n, max_n


def _parse_suffix_argument(argument: str) -> tuple[int, int]:
    match = _SUFFIX_ARGUMENT.fullmatch(argument)
    if match is None:
        raise ConfigError(f"suffix options must look like suffix:DEPTH or suffix:DEPTH:CACHE_TOKENS, e.g. "
                          f"suffix:24:200000, got suffix:{argument}")
    cache_tokens = DEFAULT_SUFFIX_CACHE_TOKENS if match.group(2) is None else int(match.group(2))
    return int(match.group(1)), cache_tokens


def _parse_lookahead_sizes(argument: str) -> tuple[int, int, int]:
    match = _LOOKAHEAD_SIZES.fullmatch(argument.replace(" ", ""))
    if match is None:
        raise ConfigError(f"lookahead sizes must look like lookahead:W,N,G, e.g. lookahead:"
                          f"{DEFAULT_LOOKAHEAD_WINDOW},{DEFAULT_LOOKAHEAD_NGRAM},{DEFAULT_LOOKAHEAD_CANDIDATES}, "
                          f"got lookahead:{argument}")
    window, ngram, candidates = map(int, match.groups())
    return window, ngram, candidates


def check_lookahead_sizes(window: int, ngram: int, candidates: int) -> None:
    """ConfigError naming the allowed range when W, N or G is outside it."""
    for name, value, (low, high) in (("W (window)", window, LOOKAHEAD_WINDOW_RANGE),
                                     ("N (n-gram size)", ngram, LOOKAHEAD_NGRAM_RANGE),
                                     ("G (candidates)", candidates, LOOKAHEAD_CANDIDATES_RANGE)):
        if not low <= value <= high:
            raise ConfigError(f"lookahead:W,N,G needs {name} in {low}..{high}, got {value}")


def lookahead_rows(window: int, ngram: int, candidates: int, k: int) -> int:
    """Rows a full lookahead step feeds after the last token: the window's W(N - 1), G candidates of
    N - 1 tokens, and prompt lookup's candidate up to k long. lookahead_rows(4, 3, 4, 4) = 8 + 8 + 2 = 18."""
    return (window + candidates) * (ngram - 1) + max(0, k - (ngram - 1))
