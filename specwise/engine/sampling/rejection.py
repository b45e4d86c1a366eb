"""The one verifier: decide which draft tokens the target keeps, and add one token of its own.

One verification step scores 1 + k_i positions for sequence i: position j < k_i
holds the target distribution at draft token j, position k_i the distribution
after the last draft. Walking the drafts in order:

  - accepted token: draft token x at position j survives the test. Sampled rows
    accept with probability min(1, p_target(x) / p_draft(x)); greedy rows accept
    when x is the target's argmax. The walk stops at the first draft that fails.
  - recovered token: at that first rejection (position j), the step emits a token
    sampled from norm(max(p_target - p_draft, 0)) at position j (greedy rows: the
    target's argmax), and discards the remaining drafts.
  - bonus token: when all k_i drafts are accepted, the step emits a token sampled
    from p_target at position k_i (greedy rows: its argmax).

So every step emits accepted + 1 tokens; a row without drafts (k_i = 0) just
samples p_target at position 0, as plain decoding would. This is lossless: the
emitted tokens have exactly the target's distribution, for any draft
distribution, provided both sides went through the same `logits_to_probs`
(temperature, top-k, top-p). N-gram drafts are one-hot: p_draft(x) = 1, so x is
accepted with probability p_target(x) and the residual is p_target with x removed.

Randomness: a sampled row draws exactly k_i + 1 uniforms from its own request's
generator per step (k_i for the acceptance tests, one for the recovered or bonus
token), whatever else is in the batch, so a seeded request reproduces its
output under any batching. Greedy rows draw nothing.

Worked example (greedy): the target's argmax at positions 0..3 is [5, 7, 2, 9].
Drafts [5, 7, 3] -> accept 5 and 7, reject 3, recover 2: emit [5, 7, 2].
Drafts [5, 7, 2] -> accept all three, bonus 9: emit [5, 7, 2, 9].
Drafts []        -> emit [5].

Token tries (several one-hot candidates at once, `spec_decode/draft_tree.py`): the walk starts
at the sequence's last token and, at each node, tries its children in order, each against the
residual of the ones rejected before it (multi-draft rejection sampling for one-hot drafts):

  - child x is accepted with probability p_res(x) / sum(p_res), where p_res starts as the
    target's distribution at the node; accepting moves the walk to x (a fresh p_res there);
  - a rejected x gets p_res(x) = 0; when every child is rejected, the recovered token is
    sampled from p_res (greedy rows: the target's argmax, which matches no child);
  - at a leaf the bonus token is sampled from the target's distribution there.

Each child passes with exactly its conditional probability given that its earlier siblings
failed, so every token is emitted with the target's probability: lossless, as for a chain,
which is the trie with one child per node (same uniforms, same tokens: node j of a chain is
tested with uniform j and the final token uses uniform num_nodes). A sampled tree draws
num_nodes + 1 uniforms per step from the request's generator, whatever the path.
"""

import torch

# Below this mass the residual max(p_target - p_draft, 0) is floating-point noise
# (it is exactly 0 only when p_target == p_draft, where no rejection can happen).
RESIDUAL_MASS_FLOOR = 1e-10


def rejection_sample(target_probs: torch.Tensor, draft_token_ids: list[list[int]],
                     draft_probs: torch.Tensor | None, greedy: list[bool],
                     generators: list[torch.Generator]) -> list[list[int]]:
    """Emitted tokens per sequence: its accepted drafts, then one recovered or bonus token.

    target_probs  [num_seqs, max_k + 1, vocab_size], from logits_to_probs
    draft_probs   [num_seqs, max_k, vocab_size] (rows past k_i unused), or None: one-hot drafts
    The number of accepted drafts of sequence i is len(result[i]) - 1.
    """
    num_seqs, num_positions, vocab_size = target_probs.shape
    max_k = num_positions - 1
    _check_batch(num_seqs, max_k, vocab_size, draft_token_ids, draft_probs, greedy, generators)
    device = target_probs.device
    num_draft_tokens = torch.tensor([len(ids) for ids in draft_token_ids], device=device)  # [num_seqs]
    padded_ids = torch.zeros(num_seqs, max_k, dtype=torch.long, device=device)  # [num_seqs, max_k]
    for row, ids in enumerate(draft_token_ids):
        padded_ids[row, :len(ids)] = torch.tensor(ids, dtype=torch.long, device=device)
    uniforms = _draw_uniforms(num_draft_tokens.tolist(), max_k, greedy, generators, device)
    greedy_mask = torch.tensor(greedy, dtype=torch.bool, device=device)  # [num_seqs]
    emitted, num_emitted = accept_and_resample(target_probs, padded_ids, num_draft_tokens, draft_probs,
                                               greedy_mask, uniforms)
    return [row[:count] for row, count in zip(emitted.tolist(), num_emitted.tolist())]


def greedy_accept(target_token_ids: list[list[int]], draft_token_ids: list[list[int]]) -> list[list[int]]:
    """The greedy path alone, for batches where every row is greedy (no probabilities needed).

    target_token_ids[i][j] is the target's argmax at position j of sequence i (1 + k_i of them);
    emits the drafts up to the first mismatch, then the target's own token there.
    """
    emitted = []
    for targets, drafts in zip(target_token_ids, draft_token_ids):
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
            accepted += 1
        emitted.append(list(drafts[:accepted]) + [targets[accepted]])
    return emitted


def accept_and_resample(target_probs: torch.Tensor, draft_token_ids: torch.Tensor,
                        num_draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
                        greedy: torch.Tensor, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The verifier on tensors, given its randomness; `rejection_sample` draws the uniforms.

    target_probs      [num_seqs, max_k + 1, vocab_size]
    draft_token_ids   [num_seqs, max_k] long, padded past num_draft_tokens
    num_draft_tokens  [num_seqs] long, k_i
    draft_probs       [num_seqs, max_k, vocab_size] or None (one-hot drafts)
    greedy            [num_seqs] bool
    uniforms          [num_seqs, max_k + 1] in [0, 1): column j < k_i tests draft j, column k_i
                      samples the recovered or bonus token
    Returns emitted [num_seqs, max_k + 1] (valid up to num_emitted) and num_emitted [num_seqs].
    """
    num_seqs, num_positions, _ = target_probs.shape
    max_k = num_positions - 1
    rows = torch.arange(num_seqs, device=target_probs.device)
    positions = torch.arange(max_k, device=target_probs.device)
    has_draft = positions.unsqueeze(0) < num_draft_tokens.unsqueeze(1)  # [num_seqs, max_k]
    accepted = has_draft & _acceptance(target_probs, draft_token_ids, draft_probs, greedy, uniforms)
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)  # [num_seqs], up to the first rejection

    final_target = target_probs[rows, num_accepted]  # [num_seqs, vocab_size]
    rejected = num_accepted < num_draft_tokens  # [num_seqs]; False: the final token is a bonus
    final_draft = _draft_probs_at(draft_probs, draft_token_ids, num_accepted.clamp(max=max(max_k - 1, 0)),
                                  final_target)  # [num_seqs, vocab_size]
    residual = torch.where(rejected.unsqueeze(1), (final_target - final_draft).clamp(min=0), final_target)
    residual_mass = residual.sum(dim=1, keepdim=True)  # [num_seqs, 1]
    residual = torch.where(residual_mass > RESIDUAL_MASS_FLOOR, residual, final_target)
    final_uniform = uniforms.gather(1, num_draft_tokens.unsqueeze(1)).squeeze(1)  # [num_seqs]
    sampled = sample_with_uniforms(residual, final_uniform)  # [num_seqs]
    final_token = torch.where(greedy, final_target.argmax(dim=1), sampled)

    emitted = torch.cat([draft_token_ids, draft_token_ids.new_zeros(num_seqs, 1)], dim=1)
    emitted[rows, num_accepted] = final_token
    return emitted, num_accepted + 1


def sample_with_uniforms(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: probs [num_rows, vocab_size] (unnormalised, >= 0), uniforms [num_rows] in [0, 1).

    Returns [num_rows] token ids; a token with zero probability is never returned.
    """
    cumulative = probs.cumsum(dim=1)  # [num_rows, vocab_size]
    targets = uniforms.to(cumulative.dtype) * cumulative[:, -1]
    chosen = torch.searchsorted(cumulative, targets.unsqueeze(1), right=True).squeeze(1)
    # rounding can put the target at the total mass itself: take the last token with mass
    vocab_size = probs.shape[1]
    last_positive = vocab_size - 1 - (probs > 0).flip(dims=[1]).long().argmax(dim=1)
    return torch.minimum(chosen, last_positive)


def _acceptance(target_probs, draft_token_ids, draft_probs, greedy, uniforms) -> torch.Tensor:
    """[num_seqs, max_k] bool: does each draft token pass its own test (ignoring earlier ones)."""
    max_k = draft_token_ids.shape[1]
    scored = target_probs[:, :max_k]  # [num_seqs, max_k, vocab_size]
    target_at_draft = scored.gather(2, draft_token_ids.unsqueeze(2)).squeeze(2)  # [num_seqs, max_k]
    if draft_probs is None:
        draft_at_draft = torch.ones_like(target_at_draft)
    else:
        draft_at_draft = draft_probs.gather(2, draft_token_ids.unsqueeze(2)).squeeze(2)  # [num_seqs, max_k]
    # u < p_target / p_draft without dividing (p_draft may be 0 for a padded or odd draft)
    passes_ratio = uniforms[:, :max_k] * draft_at_draft < target_at_draft
    matches_argmax = draft_token_ids == scored.argmax(dim=2)
    return torch.where(greedy.unsqueeze(1), matches_argmax, passes_ratio)


def _draft_probs_at(draft_probs, draft_token_ids, positions, like) -> torch.Tensor:
    """Draft distribution [num_seqs, vocab_size] at positions[i] of each row (one-hot if None)."""
    if draft_token_ids.shape[1] == 0:
        return torch.zeros_like(like)
    rows = torch.arange(draft_token_ids.shape[0], device=draft_token_ids.device)
    if draft_probs is not None:
        return draft_probs[rows, positions].to(like.dtype)
    one_hot = torch.zeros_like(like)
    one_hot[rows, draft_token_ids[rows, positions]] = 1.0
    return one_hot


def _draw_uniforms(num_draft_tokens: list[int], max_k: int, greedy: list[bool],
                   generators: list[torch.Generator], device: torch.device) -> torch.Tensor:
    """[num_seqs, max_k + 1]: k_i + 1 uniforms from each sampled row's own generator, zeros elsewhere."""
    uniforms = torch.zeros(len(num_draft_tokens), max_k + 1, device=device)
    for row, (count, is_greedy, generator) in enumerate(zip(num_draft_tokens, greedy, generators)):
        if not is_greedy:
            drawn = torch.rand(count + 1, generator=generator, device=generator.device)
            uniforms[row, :count + 1] = drawn.to(device)
    return uniforms


def _check_batch(num_seqs, max_k, vocab_size, draft_token_ids, draft_probs, greedy, generators):
    if not len(draft_token_ids) == len(greedy) == len(generators) == num_seqs:
        raise ValueError(f"target_probs has {num_seqs} sequences but draft_token_ids, greedy and generators "
                         f"have {len(draft_token_ids)}, {len(greedy)} and {len(generators)}")
    longest = max((len(ids) for ids in draft_token_ids), default=0)
    if longest > max_k:
        raise ValueError(f"a sequence has {longest} draft tokens but target_probs scores only max_k={max_k}")
    if any(not 0 <= token_id < vocab_size for ids in draft_token_ids for token_id in ids):
        raise ValueError(f"a draft token id is outside the vocabulary (size {vocab_size})")
    if draft_probs is not None and tuple(draft_probs.shape) != (num_seqs, max_k, vocab_size):
        raise ValueError(f"draft_probs has shape {tuple(draft_probs.shape)}, "
                         f"expected {(num_seqs, max_k, vocab_size)}")


def tree_greedy_accept(target_token_ids: list[int], token_ids: list[int],
                       parents: list[int]) -> tuple[list[int], list[int]]:
    """Greedy walk of a token trie: target_token_ids [1 + num_nodes] is the target's argmax after the
    last token (entry 0) and after each node (entry 1 + node). Returns (emitted tokens, accepted nodes)."""
    children = _children(parents)
    node, accepted = -1, []
    while True:
        target = target_token_ids[node + 1]
        child = next((c for c in children[node] if token_ids[c] == target), None)
        if child is None:
            return [token_ids[n] for n in accepted] + [target], accepted
        accepted.append(child)
        node = child


def tree_rejection_sample(target_probs: torch.Tensor, token_ids: list[int], parents: list[int],
                          generator: torch.Generator) -> tuple[list[int], list[int]]:
    """Sampled walk of a one-hot token trie (module docstring).

    target_probs [1 + num_nodes, vocab_size]: after the last token (row 0) and after each node
    (row 1 + node), from logits_to_probs. Returns (emitted tokens, accepted nodes)."""
    num_nodes = len(parents)
    if target_probs.shape[0] != num_nodes + 1:
        raise ValueError(f"target_probs has {target_probs.shape[0]} rows for a trie of {num_nodes} nodes")
    uniforms = torch.rand(num_nodes + 1, generator=generator, device=generator.device).tolist()
    children = _children(parents)
    node, accepted = -1, []
    residual = target_probs[0]
    rejected_any = False
    while True:
        mass = 1.0                        # the target's own rows sum to 1: test exactly as the chain does
        next_node = None
        for child in children[node]:
            token = token_ids[child]
            if uniforms[child] * mass < float(residual[token]):
                next_node = child
                break
            if not rejected_any:
                residual = residual.clone()
                rejected_any = True
            residual[token] = 0.0
            mass = float(residual.sum())
        if next_node is None:
            break
        accepted.append(next_node)
        node = next_node
        residual, rejected_any = target_probs[node + 1], False
    if rejected_any and float(residual.sum()) <= RESIDUAL_MASS_FLOOR:
        residual = target_probs[node + 1]
    final = int(sample_with_uniforms(residual.unsqueeze(0), torch.tensor([uniforms[num_nodes]],
                                                                          device=residual.device))[0])
    return [token_ids[n] for n in accepted] + [final], accepted


def _children(parents: list[int]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {-1: []}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
        children.setdefault(node, [])
    return children
