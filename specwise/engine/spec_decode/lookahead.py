"""Lookahead decoding (after Fu et al., "Break the Sequential Dependency of LLM Inference Using
Lookahead Decoding", ICML 2024): the target drafts for itself, by Jacobi iteration, in the same
forward that verifies; no draft model, no training.

Every step feeds, after a sequence's last token (at position L - 1, L = len(seq)), one draft
tree (draft_tree.py) holding two branches:

  verification branch  up to G candidates that follow the last token, merged into a trie:
                       candidate 0 is prompt lookup's (ngram.py: the longest, most recent earlier
                       match of the text's end, in the sequence's own text), up to max(k, N-1)
                       tokens (k = --num-speculative-tokens, as the ngram drafter's); the rest are
                       (N-1)-grams from the **n-gram pool** under the key = the last token, most
                       recent first. The verifier (rejection.py) keeps the longest accepted path.
  lookahead branch     the **Jacobi window**: N-1 levels x W columns of guessed tokens, level l
                       column i at position L + i + l. Row (l, i) sees the context, level 0 columns
                       0..i and levels 1..l of its own column, i.e. positions L .. L + i + l, one
                       token each. The target's argmax there guesses position L + i + l + 1.

After the step (read at the next `propose`, from the tree's `argmax`):

  - the window's N-grams go into the pool: for every column i, key level 0, then levels
    1..N-2 and the new guess of the last level (once every level came from the model);
  - the window moves one level: level l takes level l + 1, the last level takes the new guesses.
    (Exact when one token was emitted; the paper keeps the same update whatever was accepted.)

The pool is per sequence and bounded: at most G n-grams per key (most recent first) and at most
`max_pool_keys` keys (least recently updated dropped). It is seeded with the sequence's own
n-grams (prompt and output, key = a token, value = the N-1 tokens after it) as they appear.
Drafts are one-hot and chosen before the step's target forward, so the verifier keeps the
output exact for greedy and sampled requests alike. With W = 0 there is no lookahead branch:
candidates are prompt lookup's plus the text's own n-grams, never fewer than prompt lookup alone.

Rows per step: a full step feeds (W + G)(N - 1) + max(0, k - (N - 1)) rows after the last token
(fewer when there are fewer candidates). A smaller budget (the scheduler's reservation, chosen by
the k policy) keeps prompt lookup's candidate first and shrinks G and W in proportion: the extra
positions are the method's cost.

Worked example, W = 2, N = 3, G = 2, k = 2, text ... 7 9 (L = 20), pool {9: [(4, 5)]}, prompt
lookup drafts (4, 6), window levels [[1, 2], [3, 8]]:

    nodes  0: 4 (pos 20)  1: 6 (pos 21)  2: 5 (pos 21, parent 0)
    window (0,0)=1 pos 20  (0,1)=2 pos 21  (1,0)=3 pos 21  (1,1)=8 pos 22
    (1,1) sees (0,0), (0,1) and itself: the text 1 2 8 at 20..22 after the context.
    -> (2 + 2) * (3 - 1) = 8 rows at most; here 3 + 4 = 7.
"""

import random
from collections import OrderedDict
from dataclasses import dataclass, field

from specwise.engine.spec_decode.config import (DEFAULT_LOOKAHEAD_CANDIDATES, DEFAULT_LOOKAHEAD_NGRAM,
                                                DEFAULT_LOOKAHEAD_WINDOW, check_lookahead_sizes, lookahead_rows)
from specwise.engine.spec_decode.draft_tree import DraftTree, tokens_left
from specwise.engine.spec_decode.ngram import NgramProposer
from specwise.engine.spec_decode.proposer import Proposal

DEFAULT_MAX_POOL_KEYS = 4096      # per sequence: at most 4096 * G n-grams of N - 1 tokens


@dataclass
class _SequenceState:
    window: list[list[int]]                      # [N - 1][W] guessed tokens
    pool: OrderedDict = field(default_factory=OrderedDict)   # first token -> [(N-1)-tuples], newest first
    num_indexed: int = 0                         # own-text n-grams added for positions < num_indexed
    updates: int = 0                             # Jacobi updates so far: from N - 1 on, all model output
    tree: DraftTree | None = None                # the last step's tree, read at the next propose
    columns: int = 0                             # window columns that tree fed


def window_rows(width: int, levels: int) -> tuple[list[int], list[list[int]]]:
    """Offsets (position - L) and visibility (free-row indices, level-major: row l * width + i)
    of a Jacobi window of `levels` levels and `width` columns."""
    offsets, sees = [], []
    for level in range(levels):
        for column in range(width):
            offsets.append(column + level)
            earlier_columns = list(range(column)) if level == 0 else list(range(column + 1))
            sees.append(earlier_columns + [above * width + column for above in range(1, level)])
    return offsets, sees


@dataclass
class LookaheadProposer:
    window: int = DEFAULT_LOOKAHEAD_WINDOW          # W
    ngram: int = DEFAULT_LOOKAHEAD_NGRAM            # N
    candidates: int = DEFAULT_LOOKAHEAD_CANDIDATES  # G
    lookup_tokens: int = 4                          # k: prompt lookup's candidate has up to max(k, N - 1)
    max_pool_keys: int = DEFAULT_MAX_POOL_KEYS
    states: dict[int, _SequenceState] = field(default_factory=dict)    # seq_id -> state
    budget_counts_rows = True      # the scheduler's k is this step's rows (proposer.py)

    def __post_init__(self):
        check_lookahead_sizes(self.window, self.ngram, self.candidates)
        self.lookup = NgramProposer()

    @property
    def full_rows(self) -> int:
        return lookahead_rows(self.window, self.ngram, self.candidates, self.lookup_tokens)

    @property
    def lookup_depth(self) -> int:
        return max(self.lookup_tokens, self.ngram - 1)

    def sizes(self, budget: int) -> tuple[int, int, int, int]:
        """(columns W', candidates G', pool candidate length, prompt lookup's length) within `budget` rows."""
        depth = self.ngram - 1
        if budget >= self.full_rows:
            return self.window, self.candidates, depth, self.lookup_depth
        lookup = min(self.lookup_depth, budget)
        rest = budget - lookup
        more = max(0, min(self.candidates - 1, rest // depth, round((self.candidates - 1) * budget / self.full_rows)))
        return min(self.window, (rest - more * depth) // depth), 1 + more, min(depth, budget), lookup

    def auto_levels(self, max_k: int) -> list[tuple[int, int]]:
        """The auto policy's choices (policy.py): off, or the full tree, verifying its longest candidate."""
        full = min(max_k, self.full_rows)
        return [(0, 0), (full, max(self.sizes(full)[2:]))]

    def propose(self, seqs, num_draft_tokens: list[int]) -> Proposal:
        if len(seqs) != len(num_draft_tokens):
            raise ValueError(f"{len(seqs)} sequences but {len(num_draft_tokens)} draft lengths")
        trees = [self.tree(seq, budget) if budget > 0 and tokens_left(seq) > 0 else None
                 for seq, budget in zip(seqs, num_draft_tokens)]
        return Proposal([[] for _ in seqs], None, trees)

    def tree(self, seq, budget: int) -> DraftTree:
        state = self.states.get(seq.seq_id)
        if state is None:
            state = self.states[seq.seq_id] = self._new_state(seq)
        self._absorb(state)
        self._index_text(state, seq.token_ids)
        columns, num_candidates, depth, lookup_depth = self.sizes(budget)
        left = tokens_left(seq)
        tree = DraftTree.from_candidates(self._candidates(state, seq.token_ids, num_candidates, min(depth, left),
                                                          min(lookup_depth, left)))
        if columns:
            offsets, sees = window_rows(columns, self.ngram - 1)
            tokens = [token for level in state.window for token in level[:columns]]
            tree = tree.with_free_rows(tokens, offsets, sees)
        state.tree, state.columns = tree, columns
        return tree

    def free(self, seq) -> None:
        """Drop the sequence's window and pool (finished, aborted or preempted)."""
        self.states.pop(seq.seq_id, None)

    def _new_state(self, seq) -> _SequenceState:
        """A window of tokens drawn from the prompt (seeded by the request: reproducible)."""
        prompt = seq.prompt_token_ids or seq.token_ids
        rng = random.Random(seq.seed)
        return _SequenceState([[rng.choice(prompt) for _ in range(self.window)] for _ in range(self.ngram - 1)])

    def _absorb(self, state: _SequenceState) -> None:
        """The last step's guesses: collect the window's n-grams, then move it one level."""
        tree, columns = state.tree, state.columns
        state.tree = None
        if tree is None or tree.argmax is None or columns == 0:
            return
        levels = self.ngram - 1
        guesses = tree.argmax[tree.num_nodes + (levels - 1) * columns:tree.num_nodes + levels * columns]
        if state.updates >= levels:
            for column in range(columns):
                self._add(state, state.window[0][column],
                          tuple(state.window[level][column] for level in range(1, levels)) + (guesses[column],))
        for level in range(levels - 1):
            state.window[level][:columns] = state.window[level + 1][:columns]
        state.window[levels - 1][:columns] = guesses
        state.updates += 1

    def _index_text(self, state: _SequenceState, token_ids: list[int]) -> None:
        """The text's own n-grams that are complete now: key token i, value tokens i+1 .. i+N-1."""
        length = self.ngram - 1
        for start in range(state.num_indexed, len(token_ids) - length):
            self._add(state, token_ids[start], tuple(token_ids[start + 1:start + 1 + length]))
        state.num_indexed = max(state.num_indexed, len(token_ids) - length)

    def _add(self, state: _SequenceState, key: int, value: tuple[int, ...]) -> None:
        values = state.pool.pop(key, [])
        if value in values:
            values.remove(value)
        values.insert(0, value)
        state.pool[key] = values[:self.candidates]
        if len(state.pool) > self.max_pool_keys:
            state.pool.popitem(last=False)

    def _candidates(self, state: _SequenceState, token_ids: list[int], count: int, depth: int,
                    lookup_depth: int) -> list[list[int]]:
        """Up to `count` drafts: prompt lookup's (up to lookup_depth tokens), then the pool's for the last token
        (depth tokens), skipping any that an earlier one already covers as its prefix."""
        found = []
        looked_up = self.lookup.lookup(token_ids, lookup_depth)
        if looked_up:
            found.append(tuple(looked_up))
        for value in state.pool.get(token_ids[-1], []):
            if len(found) >= count:
                break
            value = value[:depth]
            if not any(chosen[:len(value)] == value for chosen in found):
                found.append(value)
        return [list(value) for value in found]
