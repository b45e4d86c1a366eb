"""N-gram drafting (prompt lookup): propose what followed the last time the recent tokens appeared.

For each sequence, take its last n tokens (n from max_n down to min_n), find an
earlier place in the sequence (prompt and output so far) where the same n
tokens occur, and propose up to k tokens that followed them there.

Rules, pinned by tests/test_ngram.py:
  - the longest n that matches anywhere wins;
  - among matches of that length, the most recent one (closest to the end) wins,
    because recent context predicts the continuation best (a variable renamed
    halfway through a prompt, the second of two similar paragraphs);
  - the suffix itself is not a match: a match must end before the last token,
    so at least one following token exists;
  - the proposal stops at the end of the sequence, so a match near the end
    proposes fewer than k tokens; no match proposes nothing.

Worked example, min_n=1, max_n=3, k=3:

    position   0  1  2  3  4  5  6  7
    token_ids  5  8  9  2  5  8  7  5
                                   ^ the sequence ends in ... 8 7 5

    n=3 suffix [8, 7, 5]: no earlier occurrence.
    n=2 suffix [7, 5]:    no earlier occurrence.
    n=1 suffix [5]:       at positions 0 and 4; the most recent is 4,
                          followed by 8, 7, 5  ->  propose [8, 7, 5].

Drafts are one-hot (p_draft(x) = 1), so the proposal has no draft probabilities.
Default n-gram sizes 2..4: a single-token match (n=1) fires on every common
token and mostly yields rejected drafts, while matches longer than 4 tokens add
little over 4; `SpeculativeConfig` ("ngram:MIN-MAX") can change both.
"""

from dataclasses import dataclass

import numpy as np

from specwise.engine.spec_decode.config import DEFAULT_MAX_N, DEFAULT_MIN_N
from specwise.engine.spec_decode.proposer import Proposal


@dataclass
class NgramProposer:
    min_n: int = DEFAULT_MIN_N
    max_n: int = DEFAULT_MAX_N

    def __post_init__(self):
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got {self.min_n}..{self.max_n}")

    def propose(self, seqs, num_draft_tokens: list[int]) -> Proposal:
        if len(seqs) != len(num_draft_tokens):
            raise ValueError(f"{len(seqs)} sequences but {len(num_draft_tokens)} draft lengths")
        drafts = [self.lookup(seq.token_ids, k) if k > 0 else []
                  for seq, k in zip(seqs, num_draft_tokens)]
        return Proposal(draft_token_ids=drafts, draft_probs=None)

    def free(self, seq) -> None:
        """Nothing to forget: the lookup reads the sequence's tokens afresh each step."""

    def lookup(self, token_ids: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the longest, most recent earlier match of the suffix."""
        end = self.match_end(token_ids)
        if end is None:
            return []
        return list(token_ids[end + 1:end + 1 + k])

    def match_end(self, token_ids: list[int]) -> int | None:
        """Position of the last token of the winning earlier match, or None."""
        num_tokens = len(token_ids)
        if num_tokens < self.min_n + 1:
            return None
        tokens = np.asarray(token_ids, dtype=np.int64)
        candidate_ends = np.arange(num_tokens - 1)  # a match must end before the last token
        match_lengths = self._match_lengths(tokens, candidate_ends)  # [num_tokens - 1]
        longest = int(match_lengths.max())
        if longest < self.min_n:
            return None
        return int(np.flatnonzero(match_lengths == longest)[-1])

    def _match_lengths(self, tokens: np.ndarray, candidate_ends: np.ndarray) -> np.ndarray:
        """For each candidate end e: how many of the last max_n tokens equal the tokens ending at e.

        Compares offset by offset, back from the last token (offset 0), and keeps
        counting only while every offset so far matched.
        """
        num_tokens = len(tokens)
        max_n = min(self.max_n, num_tokens - 1)
        still_matching = np.ones(len(candidate_ends), dtype=bool)
        lengths = np.zeros(len(candidate_ends), dtype=np.int64)
        for offset in range(max_n):
            earlier = candidate_ends - offset
            in_range = earlier >= 0
            same = np.zeros(len(candidate_ends), dtype=bool)
            same[in_range] = tokens[earlier[in_range]] == tokens[num_tokens - 1 - offset]
            still_matching &= same
            if not still_matching.any():
                break
            lengths += still_matching
        return lengths
