"""Drafts under a grammar (structured output): never verify a draft the grammar rejects, and
propose what the grammar forces for free.

For a sequence with a grammar matcher and a draft budget of k tokens:
  1. truncate: keep the drafts up to (not including) the first one the grammar rejects
     after the sequence's tokens and the drafts before it. The target would give that draft
     probability 0 (its logits are masked the same way), so it could only be rejected.
  2. forced tokens: if fewer than k drafts remain, and after them the grammar leaves exactly
     one way to continue (`"}` closing an object, the next key of a schema), append those
     tokens, up to k in all, as one-hot drafts (p_draft = 1). The verifier treats them like
     any draft, so the output keeps the target's distribution; the target's masked
     distribution at a forced position is (nearly always) that one token, so they are accepted.

A draft tree (draft_tree.py: lookahead's candidates) is pruned in place to the nodes whose path
the grammar allows; nothing is forced into a tree.

Worked example: schema {"a": integer, "b": integer}, output so far `{"a": 1`, k = 4,
n-gram drafts [`}`, `x`]: `}` is rejected (b is required) -> no drafts; the grammar allows
`,` or digits there, so nothing is forced either. After `{"a": 12,` the drafts are empty
and `"b": ` is forced: its tokens become the drafts.
"""

import torch

from specwise.engine.sampling.logits_processors import LogitsProcessing
from specwise.engine.spec_decode.proposer import Proposal


def fit_to_grammars(proposal: Proposal, seqs, num_draft_tokens: list[int],
                    processing: LogitsProcessing) -> Proposal:
    """The proposal with every structured sequence's drafts truncated and topped up with forced tokens."""
    if not processing.matchers:
        return proposal
    for row, seq in enumerate(seqs):
        tree, matcher = proposal.tree(row), processing.matcher(seq)
        if tree is not None and matcher is not None and tree.num_nodes:
            keep = [False] * tree.num_nodes
            for leaf in tree.leaves():
                path = tree.ancestors(leaf)
                for node in path[:matcher.valid_prefix(tree.path_tokens(leaf))]:
                    keep[node] = True
            tree.prune(keep)
    draft_ids = list(proposal.draft_token_ids)
    draft_probs = None if proposal.draft_probs is None else list(proposal.draft_probs)
    changed = False
    for row, (seq, budget) in enumerate(zip(seqs, num_draft_tokens)):
        matcher = processing.matcher(seq)
        if matcher is None or budget == 0 or proposal.tree(row) is not None:
            continue
        drafts = draft_ids[row]
        keep = matcher.valid_prefix(drafts)
        forced = matcher.forced_after(drafts[:keep])[:budget - keep] if keep < budget else []
        if keep == len(drafts) and not forced:
            continue
        changed = True
        draft_ids[row] = drafts[:keep] + forced
        if draft_probs is not None and draft_probs[row] is not None:
            probs = draft_probs[row][:keep]                                         # [keep, vocab]
            one_hot = torch.zeros(len(forced), probs.shape[1], dtype=probs.dtype, device=probs.device)
            if forced:
                one_hot[torch.arange(len(forced)), torch.tensor(forced)] = 1.0
            draft_probs[row] = torch.cat([probs, one_hot]) if keep + len(forced) else None
    return Proposal(draft_ids, draft_probs, proposal.trees) if changed else proposal
