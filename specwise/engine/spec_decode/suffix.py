"""Suffix decoding (after SuffixDecoding, Oliaro et al., arXiv 2411.04975): model-free drafts
from the request's own text and from a cache of earlier responses, as long as the match supports.

Terms:
  - **per-request index**: a `SuffixIndex` (suffix_index.py) over one sequence's prompt +
    output, extended with the tokens appended since the previous step. It reads
    `seq.token_ids`, which holds emitted tokens only, so rejected drafts never enter it.
  - **global cache**: a `GlobalSuffixCache` of recent completed responses (the last
    PROMPT_TAIL prompt tokens + the output, so a later request with the same prompt end can
    draft from its first output token). One per proposer, i.e. per engine and model; keyed
    by **tenant** (`seq.tenant`, None = the one default tenant), so one tenant's text never
    drafts for another's. Bounded: at most `max_tokens` stored tokens over all tenants (see
    GlobalSuffixCache); the Python heap per stored token is at most ~600 bytes (measured with
    random tokens, where every anchor is new: benchmarks/suffix_speedup.py), so the default
    200,000 tokens stay under ~120 MB. cache_tokens 0 turns it off.
  - **draft length**: the match of length m (at most max_depth) allows at most
    min(k, spec_factor * m) tokens; the walk stops earlier where the continuation's
    cumulative frequency falls below min_prob. No match, or no continuation frequent enough,
    drafts nothing for that sequence this step.
  - Per sequence, the per-request and the global lookup each give a candidate; the one with
    the higher **score** (expected accepted drafts, suffix_index.py) is proposed.

Worked example, k = 4, max_depth 24, spec_factor 1, min_prob 0.1:

    earlier response (cached):  SELECT name FROM users WHERE age > 30 ;
    this request so far:        ... SELECT name FROM users WHERE
    global: m = 5 (SELECT name FROM users WHERE), one place, continuation "age > 30 ;"
            probability 1 each, cut to min(4, 5) -> [age, >, 30, ;], score 4
    local:  no earlier "users WHERE" in this request -> nothing
    -> propose [age, >, 30, ;]; after "WHERE age" a local match of 2 would allow only 2.

Drafts are one-hot (p_draft(x) = 1), like n-gram's.
"""

import threading
from collections import deque
from dataclasses import dataclass, field

from specwise.engine.spec_decode.config import DEFAULT_SUFFIX_CACHE_TOKENS, DEFAULT_SUFFIX_DEPTH
from specwise.engine.spec_decode.proposer import Proposal
from specwise.engine.spec_decode.suffix_index import Match, SuffixIndex

DEFAULT_SPEC_FACTOR = 1.0        # draft at most spec_factor * match length tokens
DEFAULT_MIN_PROB = 0.1           # stop where the path's cumulative frequency falls below this
PROMPT_TAIL = 32                 # prompt tokens cached before each response


class GlobalSuffixCache:
    """Recent responses per tenant, at most `max_tokens` tokens in all, oldest evicted first.

    Thread-safe: the engine's step thread adds and looks up while other threads read `stats`.
    The bound counts stored tokens, one separator per response included; a response longer
    than the whole bound keeps only its last max_tokens - 1 tokens.
    """

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.indexes: dict[str | None, SuffixIndex] = {}
        self.order: deque[str | None] = deque()     # tenant of each cached response, oldest first
        self.num_tokens = 0
        self.peak_tokens = 0
        self.lock = threading.Lock()

    def add(self, tenant: str | None, tokens: list[int]) -> None:
        if self.max_tokens < 2 or not tokens:
            return
        tokens = tokens[-(self.max_tokens - 1):]
        with self.lock:
            while self.order and self.num_tokens + len(tokens) + 1 > self.max_tokens:
                self._evict_oldest()
            index = self.indexes.setdefault(tenant, SuffixIndex())
            index.append(tokens)
            index.close_document()
            self.order.append(tenant)
            self.num_tokens += len(tokens) + 1
            self.peak_tokens = max(self.peak_tokens, self.num_tokens)

    def _evict_oldest(self) -> None:
        tenant = self.order.popleft()
        index = self.indexes[tenant]
        self.num_tokens -= index.drop_oldest_document()
        if not index.document_lengths:
            del self.indexes[tenant]

    def lookup(self, tenant: str | None, pattern: list[int], max_depth: int, max_tokens: int,
               min_prob: float, spec_factor: float) -> Match:
        with self.lock:
            index = self.indexes.get(tenant)
            if index is None:
                return Match(0, [], 0.0)
            return index.lookup(pattern, max_depth, max_tokens, min_prob, spec_factor)

    def stats(self) -> dict:
        with self.lock:
            return {"responses": len(self.order), "tokens": self.num_tokens, "peak_tokens": self.peak_tokens,
                    "max_tokens": self.max_tokens, "tenants": len(self.indexes)}

    def check(self) -> None:
        """Invariants (tests): the token count adds up, stays in bound, and every index is consistent."""
        with self.lock:
            assert self.num_tokens == sum(len(index) for index in self.indexes.values()) <= self.max_tokens
            assert len(self.order) == sum(len(index.document_lengths) for index in self.indexes.values())
            for index in self.indexes.values():
                assert sum(index.document_lengths) == len(index)
                assert sum(len(ends) for ends in index.anchors.values()) == \
                    sum(length - 2 for length in index.document_lengths)


@dataclass
class _RequestState:
    index: SuffixIndex = field(default_factory=SuffixIndex)
    num_indexed: int = 0


@dataclass
class SuffixProposer:
    max_depth: int = DEFAULT_SUFFIX_DEPTH
    cache_tokens: int = DEFAULT_SUFFIX_CACHE_TOKENS
    spec_factor: float = DEFAULT_SPEC_FACTOR
    min_prob: float = DEFAULT_MIN_PROB
    cache: GlobalSuffixCache | None = None
    requests: dict[int, _RequestState] = field(default_factory=dict)   # seq_id -> its index

    def __post_init__(self):
        if self.cache is None and self.cache_tokens > 0:
            self.cache = GlobalSuffixCache(self.cache_tokens)

    def propose(self, seqs, num_draft_tokens: list[int]) -> Proposal:
        if len(seqs) != len(num_draft_tokens):
            raise ValueError(f"{len(seqs)} sequences but {len(num_draft_tokens)} draft lengths")
        return Proposal([self.draft(seq, k) if k > 0 else [] for seq, k in zip(seqs, num_draft_tokens)])

    def draft(self, seq, k: int) -> list[int]:
        token_ids = seq.token_ids
        state = self.requests.get(seq.seq_id)
        if state is None or state.num_indexed > len(token_ids):
            state = self.requests[seq.seq_id] = _RequestState()
        state.index.append(token_ids[state.num_indexed:])
        state.num_indexed = len(token_ids)
        pattern = token_ids[-self.max_depth:]
        best = state.index.lookup(pattern, self.max_depth, k, self.min_prob, self.spec_factor,
                                  exclude_end=len(token_ids) - 1)     # the pattern itself is no earlier match
        if self.cache is not None:
            cached = self.cache.lookup(seq.tenant, pattern, self.max_depth, k,
                                       self.min_prob, self.spec_factor)
            if cached.score > best.score:
                best = cached
        return best.tokens

    @property
    def cached_tokens(self) -> int:
        """Tokens held across requests (the global cache; proposer.py)."""
        return self.cache.num_tokens if self.cache is not None else 0

    def free(self, seq) -> None:
        """Drop the request's index; a finished (not aborted) response goes into the global cache."""
        self.requests.pop(seq.seq_id, None)
        if self.cache is not None and seq.is_finished and seq.finish_reason != "abort" and seq.num_output_tokens:
            self.cache.add(seq.tenant,
                           seq.prompt_token_ids[-PROMPT_TAIL:] + seq.output_token_ids)
