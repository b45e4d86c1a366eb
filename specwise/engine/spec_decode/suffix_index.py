"""A suffix index over token documents: the longest match of a pattern's suffix, and what followed it.

Terms:
  - **document**: one token sequence stored in the index (a request's prompt + output, or
    one cached response). Documents are stored back to back, each closed by SEPARATOR (-1),
    which equals no token, so neither a match nor a continuation ever crosses documents.
  - **anchor**: the last ANCHOR (2) tokens of a pattern. The index maps every anchor seen to
    the positions where it ends, oldest first; a match is always at least an anchor long.
  - **match**: an earlier place whose tokens equal the pattern's last m tokens, m <= max_depth.
    Only the longest m found is kept, with every place (up to MAX_CANDIDATES, most recent
    first) that matches that long: these are the occurrences of one node of a depth-limited
    suffix tree, and the tokens after them are that node's children.
  - **continuation**: walk forward from those places; at each step take the most frequent next
    token, with probability count(token) / number of places still on the path (the suffix
    tree's child count / parent count), keep the places that agree, and stop when the product
    of those probabilities falls below min_prob. **score** = the sum of the products along the
    path: the expected number of drafts accepted if the frequencies were the target's.

This answers the queries a depth-limited suffix tree answers, with memory linear in the tokens
stored (one list slot and one position entry per token, not one node per token and depth).

Worked example, max_depth 4, documents "a b c d" and "x b c e" (letters are token ids):

    pattern ... q b c   anchor (b, c) ends at positions 2 and 7; extending back, "q" matches
                        neither "a" nor "x", so m = 2 with both places.
    continuation        next tokens d (pos 3) and e (pos 8) tie at 1/2; a tie goes to the
                        most recent place's token, e: cum 0.5. Then the separator ends the
                        walk.  -> tokens [e], score 0.5 (with min_prob <= 0.5)
"""

from collections import Counter, deque
from dataclasses import dataclass
from itertools import islice

SEPARATOR = -1
ANCHOR = 2
MAX_CANDIDATES = 64          # places examined per query: bounds the query cost on very repetitive text


@dataclass
class Match:
    length: int              # m: how many of the pattern's last tokens matched
    tokens: list[int]        # the continuation, possibly empty
    score: float             # sum of the cumulative probabilities along `tokens`


class SuffixIndex:
    """Documents of token ids, appendable at the end, evictable from the front (oldest first)."""

    def __init__(self):
        self.tokens: list[int] = []          # documents back to back, each closed by SEPARATOR
        self.start = 0                       # absolute position of tokens[0] (grows with eviction)
        self.anchors: dict[tuple[int, int], deque[int]] = {}   # anchor -> absolute end positions
        self.document_lengths: deque[int] = deque()           # closed documents, separator included

    def __len__(self) -> int:
        """Tokens held, separators included: the unit of the global cache's memory bound."""
        return len(self.tokens)

    def append(self, new_tokens: list[int]) -> None:
        """Extend the open (last) document; indexes each anchor that ends at a new token."""
        for token in new_tokens:
            self.tokens.append(token)
            end = self.start + len(self.tokens) - 1
            if len(self.tokens) >= ANCHOR and self.tokens[-2] != SEPARATOR:
                self.anchors.setdefault((self.tokens[-2], token), deque()).append(end)

    def close_document(self) -> None:
        opened = len(self.tokens) - sum(self.document_lengths)
        self.tokens.append(SEPARATOR)
        self.document_lengths.append(opened + 1)

    def drop_oldest_document(self) -> int:
        """Forget the oldest closed document; returns how many tokens that freed."""
        length = self.document_lengths.popleft()
        for offset in range(1, length - 1):              # anchors end at offsets 1..length-2
            anchor = (self.tokens[offset - 1], self.tokens[offset])
            ends = self.anchors[anchor]
            ends.popleft()                               # its oldest end is this document's
            if not ends:
                del self.anchors[anchor]
        del self.tokens[:length]
        self.start += length
        return length

    def longest_match(self, pattern: list[int], max_depth: int, exclude_end: int | None = None) -> tuple[int, list[int]]:
        """(m, absolute end positions of the places matching the pattern's last m tokens); (0, []) if none."""
        if len(pattern) < ANCHOR:
            return 0, []
        ends = self.anchors.get((pattern[-2], pattern[-1]))
        if not ends:
            return 0, []
        tokens, start = self.tokens, self.start
        depth = min(max_depth, len(pattern))
        best, places = 0, []
        for end in islice(reversed(ends), MAX_CANDIDATES):
            if end == exclude_end:
                continue
            length = ANCHOR
            while length < depth and end - length >= start and tokens[end - length - start] == pattern[-1 - length]:
                length += 1
            if length > best:
                best, places = length, [end]
            elif length == best:
                places.append(end)
        return best, places

    def continuation(self, places: list[int], max_tokens: int, min_prob: float) -> tuple[list[int], float]:
        """The most frequent path after `places` (see the module docstring) and its score."""
        tokens, start = self.tokens, self.start
        path, score, probability = [], 0.0, 1.0
        positions = [place - start for place in places]     # relative; the path's last token so far
        while len(path) < max_tokens and positions:
            following = Counter(tokens[p + 1] for p in positions if p + 1 < len(tokens)
                                and tokens[p + 1] != SEPARATOR)
            if not following:
                break
            token, count = following.most_common(1)[0]
            probability *= count / len(positions)
            if probability < min_prob:
                break
            path.append(token)
            score += probability
            positions = [p + 1 for p in positions if p + 1 < len(tokens) and tokens[p + 1] == token]
        return path, score

    def lookup(self, pattern: list[int], max_depth: int, max_tokens: int, min_prob: float, spec_factor: float,
               exclude_end: int | None = None) -> Match:
        """Draft after `pattern`: at most min(max_tokens, spec_factor * m) tokens of the best continuation."""
        length, places = self.longest_match(pattern, max_depth, exclude_end)
        if not places:
            return Match(0, [], 0.0)
        limit = min(max_tokens, int(spec_factor * length))
        tokens, score = self.continuation(places, limit, min_prob)
        return Match(length, tokens, score)
