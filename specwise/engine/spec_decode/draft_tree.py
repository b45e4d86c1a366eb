"""Draft trees: query rows a proposer adds after a sequence's last token, at explicit positions
and with an explicit attention mask, fed in the same forward as the verification.

A chain of drafts (every proposer but lookahead) sits at consecutive positions in the
sequence's own slots and sees everything before it; the runner needs nothing more for it.
A tree is for proposers that verify several alternatives at once, or that feed rows which
are not drafts at all:

  nodes      the first len(parents) rows: a token trie to verify. Node r follows
             parents[r] (-1: the sequence's last token), sits at position
             len(seq) + depth(r) and sees the context and its ancestors. The verifier
             (engine/sampling/rejection.py, `tree_greedy_accept` / `tree_rejection_sample`)
             walks it; siblings carry different tokens.
  free rows  the rest: rows at explicit offsets (position = len(seq) + offset), each seeing
             the context and the rows listed in `sees` (any row index) besides itself. They
             are never verified: the runner writes the target's argmax at every row into
             `argmax` (lookahead reads its Jacobi window's next guesses there).

"The context" is the sequence's tokens 0 .. len(seq) - 1 (its last token is fed in the same
step). Row r's K/V goes to the sequence's slot of position len(seq) + r: slots the scheduler
reserved for this step's drafts (`ScheduledBatch.num_draft_tokens` >= num_rows), which hold
no valid K/V yet, so slot order need not be position order and nothing real is overwritten.
After verification the runner copies the accepted nodes' K/V to the slots of their positions,
len(seq) + depth (nothing to copy when the accepted path is nodes 0, 1, 2, ...: depth-first
order puts the first candidate there).

Worked example: last token at position 9 (len(seq) = 10), candidates [5, 6] and [5, 7]:

    node    0: 5 (parent -1)   1: 6 (parent 0)   2: 7 (parent 0)
    position        10                11                11
    slot of         10                11                12
    sees    ctx + 0            ctx + 0, 1        ctx + 0, 2

The target's argmax after the last token is 5 and after [..., 5] is 7: nodes 0 and 2 are
accepted and the bonus token comes from node 2's row; node 2's K/V moves from slot 12 to
slot 11. The sequence drafted 2 tokens (the accepted candidate's length) and accepted 2.
"""

from dataclasses import dataclass, field

import torch


def tokens_left(seq) -> int:
    """Drafts a verification step of `seq` can still use: max_tokens minus the output so far, minus the
    token the step emits anyway (the deepest useful tree)."""
    return seq.sampling_params.max_tokens - seq.num_output_tokens - 1


@dataclass
class DraftTree:
    token_ids: list[int]                                  # [num_rows]: nodes first, then free rows
    parents: list[int]                                    # [num_nodes]: parent node, -1 = last token
    offsets: list[int] = field(default_factory=list)      # [num_free]: position - len(seq) of free rows
    sees: list[list[int]] = field(default_factory=list)   # [num_free]: rows each free row sees (not itself)
    argmax: list[int] | None = None                       # [num_rows], written by the runner
    accepted: list[int] | None = None                     # accepted nodes, root first; written by the runner

    def __post_init__(self):
        num_nodes, num_free = len(self.parents), len(self.token_ids) - len(self.parents)
        if num_free < 0 or len(self.offsets) != num_free or len(self.sees) != num_free:
            raise ValueError(f"a draft tree of {len(self.token_ids)} rows has {num_nodes} parents, "
                             f"{len(self.offsets)} offsets and {len(self.sees)} visibility lists")
        if any(not -1 <= parent < node for node, parent in enumerate(self.parents)):
            raise ValueError(f"every node's parent must come before it (or be -1): {self.parents}")
        if any(offset < 0 for offset in self.offsets):
            raise ValueError(f"free rows sit at or after len(seq): offsets {self.offsets}")
        if any(not 0 <= row < self.num_rows for rows in self.sees for row in rows):
            raise ValueError(f"a free row sees a row outside 0..{self.num_rows - 1}")
        children = {}
        for node, parent in enumerate(self.parents):
            if self.token_ids[node] in children.setdefault(parent, set()):
                raise ValueError(f"node {node} repeats a sibling's token {self.token_ids[node]}")
            children[parent].add(self.token_ids[node])

    @classmethod
    def from_candidates(cls, candidates: list[list[int]]) -> "DraftTree":
        """The trie of candidate drafts (shared prefixes merged), depth first, candidates in order:
        the first candidate's tokens are nodes 0, 1, 2, ..."""
        trie: dict[int, dict] = {}
        for candidate in candidates:
            level = trie
            for token in candidate:
                level = level.setdefault(token, {})
        token_ids, parents = [], []

        def walk(level: dict, parent: int) -> None:
            for token, below in level.items():        # dicts keep insertion order
                token_ids.append(token)
                parents.append(parent)
                walk(below, len(parents) - 1)

        walk(trie, -1)
        return cls(token_ids, parents)

    def with_free_rows(self, token_ids: list[int], offsets: list[int], sees: list[list[int]]) -> "DraftTree":
        """This trie plus free rows; `sees` indexes the free rows among themselves (0 = the first free row)."""
        base = self.num_nodes
        return DraftTree(self.token_ids[:base] + list(token_ids), list(self.parents), list(offsets),
                         [[base + row for row in rows] for rows in sees])

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @property
    def num_rows(self) -> int:
        return len(self.token_ids)

    def depths(self) -> list[int]:
        depths = []
        for parent in self.parents:
            depths.append(0 if parent < 0 else depths[parent] + 1)
        return depths

    def position_offsets(self) -> list[int]:
        """[num_rows] position - len(seq) of every row."""
        return self.depths() + list(self.offsets)

    def ancestors(self, node: int) -> list[int]:
        """Nodes from the root's child down to `node`, inclusive."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def path_tokens(self, node: int) -> list[int]:
        return [self.token_ids[index] for index in self.ancestors(node)]

    def children(self) -> list[list[int]]:
        """[num_nodes + 1]: children of each node, the last entry those of the root (-1)."""
        children = [[] for _ in range(self.num_nodes + 1)]
        for node, parent in enumerate(self.parents):
            children[parent].append(node)
        return children

    def visibility(self) -> torch.Tensor:
        """[num_rows, num_rows] bool: row r attends to row c's K/V (besides the context)."""
        visible = torch.eye(self.num_rows, dtype=torch.bool)
        for node in range(self.num_nodes):
            visible[node, self.ancestors(node)] = True
        for free, rows in enumerate(self.sees):
            visible[self.num_nodes + free, rows] = True
        return visible

    def attention_mask(self, context_len: int) -> torch.Tensor:
        """[1 + num_rows, context_len + num_rows] bool, the step's mask for this sequence: key column c < context_len
        is position c (context_len = len(seq); the last token's own column included), column context_len + r
        is row r's slot. Query 0 is the last token: it sees the context; query 1 + r sees the context and
        the rows of `visibility()`."""
        mask = torch.zeros(1 + self.num_rows, context_len + self.num_rows, dtype=torch.bool)
        mask[:, :context_len] = True
        mask[1:, context_len:] = self.visibility()
        return mask

    def drafted(self, accepted_nodes: list[int]) -> int:
        """Draft tokens counted for a step that accepted `accepted_nodes` (a root path): the length
        of the longest candidate through them, i.e. the depth of the deepest node below the last one."""
        if self.num_nodes == 0:
            return 0
        depths = self.depths()
        if not accepted_nodes:
            return 1 + max(depths)
        last = accepted_nodes[-1]
        below = [node for node in range(last, self.num_nodes) if last in self.ancestors(node)]
        return 1 + max(depths[node] for node in below)

    def prune(self, keep: list[bool]) -> None:
        """Drop, in place, the nodes where keep is False and everything below them; free rows stay,
        their `sees` renumbered (a free row that saw a dropped node no longer does). In place, so a
        proposer that kept this tree still reads its `argmax` after the step."""
        kept = []
        for node, parent in enumerate(self.parents):
            if keep[node] and (parent < 0 or parent in kept):
                kept.append(node)
        new_index = {old: new for new, old in enumerate(kept)}
        new_index.update({self.num_nodes + free: len(kept) + free for free in range(self.num_rows - self.num_nodes)})
        self.token_ids = [self.token_ids[node] for node in kept] + self.token_ids[self.num_nodes:]
        self.parents = [-1 if self.parents[node] < 0 else new_index[self.parents[node]] for node in kept]
        self.sees = [[new_index[row] for row in rows if row in new_index] for rows in self.sees]

    def leaves(self) -> list[int]:
        parents = set(self.parents)
        return [node for node in range(self.num_nodes) if node not in parents]
