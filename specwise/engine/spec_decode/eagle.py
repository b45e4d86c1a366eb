"""EAGLE and EAGLE-3 drafting: one decoder layer extrapolates the target's features (models/heads/eagle.py),
or, for EAGLE-3, the fused residual streams of three of its layers (models/heads/eagle3.py).

Pairs, with the convention of models/heads/eagle.py: pair t = (f_t, embed(x_{t+1})) at position t
gives f̂_{t+1}, and lm_head(f̂_{t+1}) drafts token t+2. For a sequence of n tokens whose
head K/V holds pairs 0..paired-1 computed from the target's true features:

  1. catch up: pairs paired..n-2 from true features (the target's features of every position
     below num_computed_tokens = n - 1, prompt included, arrive through the runner's feature
     observer), one flat forward for all sequences; the last pair's f̂_{n-1} drafts d_1;
  2. round j = 2..k: pair n+j-3 = (f̂_{n+j-3}, d_{j-1}) drafts d_j, one query per sequence,
     all sequences in one flat forward.

Worked example (n = 5, k = 3, paired = 2): catch-up pairs 2, 3 -> f̂_4 -> d_1; pair 4 =
(f̂_4, d_1) -> d_2; pair 5 = (f̂_5, d_2) -> d_3. Afterwards paired = 4: pairs 4 and 5 came from
predicted features, and the next catch-up recomputes them from the target's (however many
drafts it accepted). The head's K/V lives in a cache of its own, addressed through the
target's block tables (pair t in the slot of position t), so the scheduler's lookahead slots
hold the predicted pairs and rollback is bookkeeping, as for the target.

Draft tokens are sampled from the request's processed distribution of lm_head(f̂)
(draft_sampler.py). The embedding and the LM head are the target model's own modules (also
when quantized; the LM head restricted to the head's draft vocabulary if it has one, see
heads.py); the head runs in the target's compute dtype.

EAGLE-3 pairs the same way: the catch-up's true inputs are the target's residual streams at the
head's aux_layers (observed with the features; the target then runs eager), fused by the head's fc;
each step drafts from the layer's normed output and feeds its un-normed output back (`head.step`).
"""

from dataclasses import dataclass, field

import torch

from specwise.engine.spec_decode.context import ProposerContext
from specwise.engine.spec_decode.draft_sampler import DraftSampler, stack_draft_probs
from specwise.engine.spec_decode.heads import DraftLMHead, load_head
from specwise.engine.spec_decode.proposer import Proposal
from specwise.engine.step_features import StepFeatures
from specwise.models.attention import step_metadata


@dataclass
class EagleState:
    """One sequence: how many pairs the head's K/V holds from true features, and the target's
    features not yet paired, as (first position, [n, hidden]) segments in position order."""

    paired: int = 0
    segments: list[tuple[int, torch.Tensor]] = field(default_factory=list)

    def add(self, position: int, features: torch.Tensor) -> None:
        """Features from `position` on replace whatever was kept there (rejected drafts' rows)."""
        self.segments = [(start, rows[:position - start]) for start, rows in self.segments if start < position]
        self.segments.append((position, features))

    def features(self, start: int, end: int) -> torch.Tensor:
        """The features of positions start..end-1, [end - start, hidden]."""
        parts = [rows[max(0, start - first):end - first] for first, rows in self.segments
                 if first < end and first + len(rows) > start]
        found = sum(len(part) for part in parts)
        if found != end - start:
            raise RuntimeError(f"EAGLE drafter: the target's features of positions {start}..{end - 1} were not "
                               f"all observed ({found} of {end - start})")
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def forget_before(self, position: int) -> None:
        self.segments = [(max(first, position), rows[max(0, position - first):]) for first, rows in self.segments
                         if first + len(rows) > position]


class EagleProposer:
    def __init__(self, context: ProposerContext, directory: str | None = None, kind: str = "eagle"):
        target = context.runner
        self.runner = target
        self.model = target.model                      # its embedding and LM head draft too
        # directory None: the built-in head for this target
        self.directory, drafter, self.head = load_head(kind, directory, context)
        self.aux_layers = drafter.aux_layers           # eagle3: the residual streams it fuses; eagle: None
        self.lm_head = DraftLMHead(self.model, drafter.draft_vocab, context)
        config = self.model.config
        shape = (1, 2, config.num_key_value_heads, target.num_blocks * target.block_size, config.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=context.dtype, device=context.device)
        self.kv_cache_bytes = self.kv_cache.numel() * self.kv_cache.element_size()
        self.sampler = DraftSampler(target)
        self.states: dict[int, EagleState] = {}
        context.observe_features(self.observe, self.aux_layers)

    def observe(self, step: StepFeatures) -> None:
        for seq, position, features in step.rows(step.hidden if self.aux_layers is None else step.layers):
            if seq.sampling_params.speculative:
                self.states.setdefault(seq.seq_id, EagleState()).add(position, features.clone())

    @torch.inference_mode()
    def propose(self, seqs, num_draft_tokens: list[int]) -> Proposal:
        rows = [row for row, k in enumerate(num_draft_tokens) if k > 0]
        draft_ids = [[] for _ in seqs]
        draft_probs = [[] for _ in seqs]
        if not rows:
            return Proposal(draft_ids)
        # 1. catch-up: pairs start..n-2 of every drafting sequence, from the target's features
        starts, features, next_tokens = [], [], []
        for row in rows:
            seq, state = seqs[row], self.states.setdefault(seqs[row].seq_id, EagleState())
            last = len(seq) - 2                        # the last pair with a true feature: (f_{n-2}, x_{n-1})
            start = min(state.paired, last)
            starts.append(start)
            features.append(state.features(start, last + 1))
            next_tokens.append(seq.token_ids[start + 1:last + 2])
            state.paired = last + 1
            state.forget_before(last)                  # f_{n-2} stays: the next catch-up may need it
        drafted, fed = self._pairs(seqs, rows, starts, torch.cat(features), next_tokens, fuse=True)
        active = rows
        while True:
            logits = self.lm_head(drafted)                                              # [len(active), vocab]
            probs, tokens = self.sampler.sample(logits, [seqs[row] for row in active],
                                                [draft_ids[row] for row in active])
            for row, row_probs, token in zip(active, probs, tokens):
                draft_ids[row].append(token)
                draft_probs[row].append(row_probs)
            keep = [index for index, row in enumerate(active) if len(draft_ids[row]) < num_draft_tokens[row]]
            if not keep:
                break
            active = [active[index] for index in keep]
            # 2. the next round: pair (f̂, last draft) at the position before that draft's
            positions = [len(seqs[row]) + len(draft_ids[row]) - 2 for row in active]
            drafted, fed = self._pairs(seqs, active, positions, fed[keep], [[draft_ids[row][-1]] for row in active])
        stacked = stack_draft_probs(draft_probs)   # [k_i, vocab] or None (one-hot) each
        return Proposal(draft_ids, stacked)

    def _pairs(self, seqs, rows: list[int], starts: list[int], features: torch.Tensor,
               next_tokens: list[list[int]], fuse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """One flat head forward over runs of pairs (features [sum(len(run)), width], the tokens that
        followed them) at positions starts[i]...; fuse: the features are the target's (head.fuse first).
        Returns, for the last pair of each run, (what drafts, what is fed back), [len(rows), hidden] each."""
        tables = [seqs[row].block_table for row in rows]
        input_ids, positions, metadata = self.runner.prepare(next_tokens, starts, tables)
        embeddings = self.model.embed_tokens(input_ids)                                 # [num_pairs, hidden]
        features = features.to(embeddings.dtype)
        if fuse:
            features = self.head.fuse(features)
        with step_metadata(metadata):
            drafted, fed = self.head.step(features, embeddings, positions, self.kv_cache)   # [num_pairs, hidden]
        ends = torch.tensor([len(run) for run in next_tokens], device=drafted.device).cumsum(0) - 1
        return drafted[ends], fed[ends]

    def free(self, seq) -> None:
        self.states.pop(seq.seq_id, None)
        self.sampler.free(seq)
