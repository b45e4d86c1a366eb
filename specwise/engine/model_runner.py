"""The one place that builds tensors: token lists and block tables in, logits and tokens out.

A step is flat (see models/attention.py): sequence i feeds a run of query tokens (a prompt
chunk, or its last token plus k_i drafts), all runs concatenated into one row dimension.
Logits are computed only where tokens are sampled: the last 1 + k_i positions of a
sequence that emits this step, none for a prompt chunk that does not reach its end. A request
that asked for prompt logprobs also gets logits at its chunk's prompt positions, until its first
output (they are a suffix of the chunk: positions already recorded come first).

Worked example (prompt_logprobs, prompt of 10 tokens, chunks of 4): chunk 0..3 gives rows 0..3
(tokens 1..4), chunk 4..7 rows 4..7 (tokens 5..8), chunk 8..9 rows 8 (token 9) + 9 (sampled).
A preemption before the first output recomputes chunks whose positions are already held: no rows.
"""

import itertools
from typing import Callable

import torch

from specwise.engine.cost.kv_reads import KVReads
from specwise.engine.fault_isolation import RequestFault
from specwise.engine.outputs import TokenLogprob
from specwise.engine.sampling.logits_processors import LogitsProcessing, Row
from specwise.engine.sampling.rejection import (greedy_accept, rejection_sample, tree_greedy_accept,
                                                tree_rejection_sample)
from specwise.engine.sampling.sampler import SamplingTensors, logits_to_probs, request_generator
from specwise.engine.scheduler import ScheduledBatch
from specwise.engine.sequence import Sequence
from specwise.engine.spec_decode.draft_tree import DraftTree
from specwise.engine.spec_decode.proposer import Proposal
from specwise.engine.step_features import StepFeatures
from specwise.models.attention import GROUP_SIZE, AttentionMetadata, CachedGroup, PrefillChunk, step_metadata
from specwise.models.compile.graphs import CompiledForward, GraphSet, scratch_cache
from specwise.models.llama import LlamaForCausalLM


def kv_block_bytes(model: LlamaForCausalLM, block_size: int, dtype: torch.dtype) -> int:
    config = model.config
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
    return per_token * block_size * torch.tensor([], dtype=dtype).element_size()


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: str = "cpu", compiled: bool = False, graph_set: GraphSet | None = None):
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = device
        config = model.config
        cache_shape = (config.num_hidden_layers, 2, config.num_key_value_heads, num_blocks * block_size,
                       config.head_dim)
        self.kv_cache = torch.zeros(cache_shape, dtype=dtype, device=device)
        # the model's forward, or its compiled graphs (models/compile/graphs.py), compiled now, not at the first request
        self.forward_fn = CompiledForward(model, self.kv_cache, graph_set) if compiled else model
        # the forwards' depths asked for (None: all layers; a layer-skip drafter's L), compiled or not
        self.depths: list[int | None] = [None]
        self.generators: dict[int, torch.Generator] = {}
        # penalties, min_tokens, logit_bias, grammars; the engine shares one with its drafters
        self.processing = LogitsProcessing([])
        # seq_id -> logprobs of the tokens the last step emitted (requests that asked for them)
        self.step_logprobs: dict[int, list[TokenLogprob]] = {}
        # seq_id -> prompt token i's logprob so far (None for token 0), until the first output takes it
        self.prompt_logprobs: dict[int, list[TokenLogprob | None]] = {}
        # drafters that read the target's features (step_features.py); empty: nothing is kept
        self.feature_observers: list[Callable[[StepFeatures], None]] = []
        # layer ids whose residual streams they read too (EAGLE-3); the target then runs eager
        self.feature_layers: list[int] = []

    def warm_up(self, num_layers: int) -> None:
        """Compile now (under --compile) the graphs of a forward through the first num_layers layers. Only while
        no request is in flight (as drafters are set up): the warm-up's prefills write the cache's first slots."""
        if num_layers not in self.depths:
            self.depths.append(num_layers)
        if isinstance(self.forward_fn, CompiledForward):
            self.forward_fn.warm_up(self.kv_cache, num_layers)

    def use_forward(self, forward: CompiledForward) -> None:
        """Run forward from the next step on, once each of its graphs has run over a scratch cache (this cache
        may hold K/V of requests in flight). Between steps only; what a graph raises is raised, nothing changed."""
        forward.check(scratch_cache(self.kv_cache))
        self.forward_fn = forward

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's LM head as this runner runs it (compiled or not), hidden [rows, hidden] -> [rows, vocab]."""
        return self.forward_fn.compute_logits(hidden)

    def blocks_for(self, num_slots: int) -> int:
        return -(-num_slots // self.block_size)

    @property
    def kv_reads(self) -> KVReads:
        """How `prepare`'s groups read the cache (kv_reads.py): what a step's KV tokens cost on this runner."""
        return KVReads(GROUP_SIZE, self.block_size)

    @torch.inference_mode()
    def forward(self, token_ids: list[list[int]], start_positions: list[int], block_tables: list[list[int]],
                num_logits: list[int], num_layers: int | None = None,
                trees: list[DraftTree | None] | None = None) -> torch.Tensor:
        """Run the model over the runs token_ids[i] (at positions start_positions[i]...);
        returns logits of the last num_logits[i] positions of each run, flat and in order,
        [sum(num_logits), vocab_size] fp32.

        trees[i] (a decoding sequence's draft tree, spec_decode/draft_tree.py): run i is then the
        last token followed by the tree's rows, at the tree's positions and with its mask."""
        hidden = self.hidden_states(token_ids, start_positions, block_tables, num_layers, trees)
        return self.logits_at(hidden, [len(run) for run in token_ids], num_logits)

    @torch.inference_mode()
    def hidden_states(self, token_ids: list[list[int]], start_positions: list[int], block_tables: list[list[int]],
                      num_layers: int | None = None, trees: list[DraftTree | None] | None = None,
                      residuals: dict | None = None) -> torch.Tensor:
        """The final-normed hidden state (feature) of every fed token, [sum(len(run)), hidden]; residuals:
        the layers' residual streams are stored in it too (LlamaForCausalLM.forward), by the eager model."""
        input_ids, positions, metadata = self.prepare(token_ids, start_positions, block_tables, trees)
        with step_metadata(metadata):
            if residuals is not None:
                return self.model(input_ids, positions, self.kv_cache, num_layers, residuals)
            return self.forward_fn(input_ids, positions, self.kv_cache, num_layers)

    @torch.inference_mode()
    def logits_at(self, hidden: torch.Tensor, run_lengths: list[int], num_logits: list[int]) -> torch.Tensor:
        """Logits of the last num_logits[i] rows of each run of `hidden`, [sum(num_logits), vocab] fp32."""
        ends = list(itertools.accumulate(run_lengths))
        rows = [row for end, count in zip(ends, num_logits) for row in range(end - count, end)]
        if len(rows) < hidden.shape[0]:
            hidden = hidden[torch.tensor(rows, dtype=torch.long, device=self.device)]   # [sum(num_logits), hidden]
        return self.forward_fn.compute_logits(hidden)

    def prepare(self, token_ids, start_positions, block_tables, trees=None):
        """Flat index tensors of one step, built on the host (no size is read back from the device):
        input_ids and positions [sum(len(run))] and the attention metadata. A drafter that runs its
        own layers over this runner's block layout (eagle.py) builds its steps with it too."""
        trees = trees or [None] * len(token_ids)
        offsets = torch.arange(self.block_size)
        new_slots, prefills, cached, positions, row = [], [], {}, [], 0
        for run, start, table, tree in zip(token_ids, start_positions, block_tables, trees):
            # the cache slot of every position 0 .. start + len(run) - 1, on the host (a tree's rows:
            # the slots after the last token's, in row order, see draft_tree.py)
            context = (torch.tensor(table).unsqueeze(1) * self.block_size + offsets).view(-1)[:start + len(run)]
            new_slots.append(context[start:])
            if tree is None:
                positions.extend(range(start, start + len(run)))
            else:
                if len(run) != 1 + tree.num_rows:
                    raise ValueError(f"a tree sequence feeds its last token and {tree.num_rows} rows, got {len(run)}")
                positions.extend([start] + [start + 1 + offset for offset in tree.position_offsets()])
            if start == 0:
                prefills.append(PrefillChunk(row, row + len(run)))
            else:
                visible = None if tree is None else tree.attention_mask(start + 1)
                cached.setdefault((len(run), tree is not None), []).append((row, start, context, visible))
            row += len(run)
        # one group that is the whole batch keeps row order: attention takes and gives the rows as they are
        whole_batch = not prefills and len(cached) == 1 and len(next(iter(cached.values()))) <= GROUP_SIZE
        groups = [self._group(q_len, members[index:index + GROUP_SIZE], whole_batch)
                  for (q_len, _), seqs in cached.items()
                  for members in [seqs if whole_batch else sorted(seqs, key=lambda seq: len(seq[2]))]
                  for index in range(0, len(members), GROUP_SIZE)]
        device = self.device
        input_ids = torch.tensor([token for run in token_ids for token in run], device=device)
        metadata = AttentionMetadata(torch.cat(new_slots).to(device), prefills, groups)
        return input_ids, torch.tensor(positions, device=device), metadata

    def _group(self, q_len: int, members: list[tuple[int, int, torch.Tensor, torch.Tensor | None]],
               whole_batch: bool = False) -> CachedGroup:
        """members: (first query row, start position, context slots, visibility [q_len, len(context)] or None
        for the causal run) of sequences with q_len queries; whole_batch: they are every row, in order."""
        num_blocks = self.blocks_for(max(len(context) for _, _, context, _ in members))
        block_tables = torch.zeros(len(members), num_blocks, dtype=torch.long)    # padding reads block 0, masked
        for index, (_, _, context, _) in enumerate(members):
            block_tables[index, :self.blocks_for(len(context))] = context[::self.block_size] // self.block_size
        context_len = num_blocks * self.block_size
        rows = torch.tensor([row + j for row, _, _, _ in members for j in range(q_len)])
        bias = None
        if q_len > 1 or any(len(context) < context_len for _, _, context, _ in members):
            # query j of a sequence starting at s sits at position s + j and sees keys 0 .. s + j
            visible_until = torch.tensor([[start + j for j in range(q_len)] for _, start, _, _ in members])
            visible = torch.arange(context_len).view(1, 1, -1) <= visible_until.unsqueeze(2)
            for index, (_, _, context, custom) in enumerate(members):
                if custom is not None:
                    visible[index] = False
                    visible[index, :, :len(context)] = custom
            bias = torch.zeros(visible.shape, dtype=self.kv_cache.dtype).masked_fill(~visible, float("-inf"))
            bias = bias.to(self.device)
        rows = None if whole_batch else rows.to(self.device)
        return CachedGroup(rows, block_tables.to(self.device), bias, q_len, self.block_size)

    def execute(self, batch: ScheduledBatch, proposal: Proposal | None) -> list[list[int]]:
        """Run one scheduled step; returns the tokens each sequence emits (none for a prompt
        chunk that does not reach the end of its prompt)."""
        seqs = batch.seqs
        draft_token_ids = proposal.draft_token_ids if proposal is not None else [[] for _ in seqs]
        trees = [None if proposal is None else proposal.tree(index) for index in range(len(seqs))]
        for index, tree in enumerate(trees):
            if tree is not None and tree.num_rows > batch.num_draft_tokens[index]:
                raise ValueError(f"a draft tree of {tree.num_rows} rows exceeds the "
                                 f"{batch.num_draft_tokens[index]} slots reserved for it")
        token_ids = [seq.token_ids[seq.num_computed_tokens:seq.num_computed_tokens + count] +
                     (drafts if tree is None else tree.token_ids)
                     for seq, count, drafts, tree in zip(seqs, batch.num_new_tokens, draft_token_ids, trees)]
        emitting = [index for index in range(len(seqs)) if batch.samples(index)]
        num_logits = [0] * len(seqs)
        for index in emitting:
            num_logits[index] = len(token_ids[index]) - batch.num_new_tokens[index] + 1
        prompt_rows = [self._prompt_rows(seq, count) for seq, count in zip(seqs, batch.num_new_tokens)]
        starts, run_lengths = [seq.num_computed_tokens for seq in seqs], [len(run) for run in token_ids]
        residuals = dict.fromkeys(self.feature_layers) if self.feature_observers and self.feature_layers else None
        hidden = self.hidden_states(token_ids, starts, [seq.block_table for seq in seqs], trees=trees,
                                    residuals=residuals)                                    # [rows, hidden]
        if self.feature_observers:
            layers = torch.cat([residuals[i] for i in self.feature_layers], dim=-1) if residuals else None
            features = StepFeatures(seqs, starts, run_lengths, hidden, layers)
            for observe in self.feature_observers:
                observe(features)
        logits = self.logits_at(hidden, run_lengths,
                                [extra + count for extra, count in zip(prompt_rows, num_logits)])  # [rows, vocab]
        if any(prompt_rows):
            logits = self._take_prompt_logprobs(logits, seqs, prompt_rows, num_logits)    # [sum(num_logits), vocab]
        emitted = [[] for _ in seqs]
        if emitting:
            tokens = self.verify(logits, [seqs[i] for i in emitting], [draft_token_ids[i] for i in emitting],
                                 proposal, emitting, [trees[i] for i in emitting])
            for index, row_tokens in zip(emitting, tokens):
                emitted[index] = row_tokens
            self._move_accepted_kv([seqs[i] for i in emitting], [trees[i] for i in emitting])
        return emitted

    def _prompt_rows(self, seq: Sequence, count: int) -> int:
        """How many of this chunk's positions give prompt logprobs: the chunk's last ones before its
        sampled position, not yet held. Position p's logits give prompt token p + 1."""
        if seq.sampling_params.prompt_logprobs is None or seq.num_output_tokens:
            return 0
        held = self.prompt_logprobs.setdefault(seq.seq_id, [None])
        first = max(seq.num_computed_tokens, len(held) - 1)
        last = min(seq.num_computed_tokens + count - 1, seq.num_prompt_tokens - 2)
        return max(0, last - first + 1)

    def _take_prompt_logprobs(self, logits: torch.Tensor, seqs: list[Sequence], prompt_rows: list[int],
                              num_logits: list[int]) -> torch.Tensor:
        """Record the prompt rows' logprobs (the raw log_softmax); returns the sampled rows alone."""
        row, sampled = 0, []
        for seq, extra, count in zip(seqs, prompt_rows, num_logits):
            if extra:
                held = self.prompt_logprobs[seq.seq_id]
                tokens = seq.token_ids[len(held):len(held) + extra]
                held += token_logprobs(logits[row:row + extra], tokens, seq.sampling_params.prompt_logprobs)
            sampled.extend(range(row + extra, row + extra + count))
            row += extra + count
        return logits[torch.tensor(sampled, dtype=torch.long, device=logits.device)]

    def verify(self, logits: torch.Tensor, seqs: list[Sequence], draft_token_ids: list[list[int]],
               proposal: Proposal | None, batch_rows: list[int],
               trees: list[DraftTree | None] | None = None) -> list[list[int]]:
        """logits [sum(1 + rows_i), vocab]: each sequence's last token and its 1 + k_i drafts (a chain) or
        its tree's rows, in order -> emitted tokens.

        Position j of sequence i is processed (penalties, grammar, ...) as if drafts 0..j-1 were
        accepted: the distribution plain decoding would sample there once they are emitted; a tree
        node's row as if the path to it were. A tree's free rows only give their argmax back."""
        trees = trees or [None] * len(seqs)
        lengths = [1 + len(drafts) if tree is None else 1 + tree.num_rows
                   for drafts, tree in zip(draft_token_ids, trees)]
        starts = [0, *itertools.accumulate(lengths)]
        scored, rows = [], []          # logits rows that are verified, and how each is processed
        for seq, drafts, tree, start in zip(seqs, draft_token_ids, trees, starts):
            if tree is None:
                scored.extend(range(start, start + 1 + len(drafts)))
                rows.extend(Row(seq, drafts[:j]) for j in range(1 + len(drafts)))
            else:
                tree.argmax = logits[start + 1:start + 1 + tree.num_rows].argmax(dim=-1).tolist()
                scored.extend(range(start, start + 1 + tree.num_nodes))
                rows.extend([Row(seq, [])] + [Row(seq, tree.path_tokens(node)) for node in range(tree.num_nodes)])
        if len(scored) < logits.shape[0]:
            logits = logits[torch.tensor(scored, device=self.device)]
        logits = self.processing.apply(logits, rows)                             # [sum(1 + k_i or nodes), vocab]
        check_finite(logits, rows)
        num_scored = [1 + len(drafts) if tree is None else 1 + tree.num_nodes
                      for drafts, tree in zip(draft_token_ids, trees)]
        starts = [0, *itertools.accumulate(num_scored)]
        chains = [i for i, tree in enumerate(trees) if tree is None]
        emitted: list[list[int]] = [[] for _ in seqs]
        token_rows: list[list[int]] = [[] for _ in seqs]      # logits row of each emitted token
        if chains:
            chain_logits = logits[torch.tensor([row for i in chains for row in range(starts[i], starts[i + 1])],
                                               device=self.device)] if len(chains) < len(seqs) else logits
            chain_tokens = self._verify_chains(chain_logits, [seqs[i] for i in chains],
                                               [draft_token_ids[i] for i in chains], proposal,
                                               [batch_rows[i] for i in chains])
            for i, tokens in zip(chains, chain_tokens):
                emitted[i] = tokens
                token_rows[i] = list(range(starts[i], starts[i] + len(tokens)))
        for i, tree in enumerate(trees):
            if tree is None:
                continue
            seq, tree_logits = seqs[i], logits[starts[i]:starts[i + 1]]                # [1 + nodes, vocab]
            if seq.sampling_params.greedy:
                emitted[i], tree.accepted = tree_greedy_accept(tree_logits.argmax(dim=-1).tolist(),
                                                               tree.token_ids, tree.parents)
            else:
                probs = self.distribution(tree_logits.unsqueeze(0), [seq])[0]          # [1 + nodes, vocab]
                emitted[i], tree.accepted = tree_rejection_sample(probs, tree.token_ids, tree.parents,
                                                                  self.generator(seq))
            token_rows[i] = [starts[i]] + [starts[i] + 1 + node for node in tree.accepted]
        self._record_logprobs(logits, seqs, token_rows, emitted)
        return emitted

    def _verify_chains(self, logits: torch.Tensor, seqs: list[Sequence], draft_token_ids: list[list[int]],
                       proposal: Proposal | None, batch_rows: list[int]) -> list[list[int]]:
        """The chain sequences' processed logits [sum(1 + k_i), vocab] -> emitted tokens."""
        lengths = [1 + len(drafts) for drafts in draft_token_ids]
        starts = [0, *itertools.accumulate(lengths)]
        if all(seq.sampling_params.greedy for seq in seqs):
            argmax = logits.argmax(dim=-1).tolist()
            return greedy_accept([argmax[start:end] for start, end in zip(starts, starts[1:])], draft_token_ids)
        width = max(lengths)
        index = torch.tensor([[start + min(j, length - 1) for j in range(width)]
                              for start, length in zip(starts, lengths)], device=self.device)
        target_probs = self.distribution(logits[index], seqs)                            # [n, 1 + max_k, vocab]
        draft_probs = None
        if proposal is not None and width > 1:
            padded = proposal.padded_draft_probs(width - 1, target_probs.shape[2], self.device)
            draft_probs = None if padded is None else padded[torch.tensor(batch_rows, device=self.device)]
        generators = [self.generator(seq) for seq in seqs]
        greedy = [seq.sampling_params.greedy for seq in seqs]
        return rejection_sample(target_probs, draft_token_ids, draft_probs, greedy, generators)

    def _move_accepted_kv(self, seqs: list[Sequence], trees: list[DraftTree | None]) -> None:
        """Copy the accepted tree nodes' K/V from their rows' slots to the slots of their positions
        (len(seq) + depth), every layer at once; nodes already in place are skipped."""
        sources, targets = [], []
        for seq, tree in zip(seqs, trees):
            if tree is None:
                continue
            base = len(seq)                  # before the engine appends the emitted tokens
            for depth, node in enumerate(tree.accepted):
                if node != depth:
                    sources.append(self.slot(seq, base + node))
                    targets.append(self.slot(seq, base + depth))
        if sources:
            source = torch.tensor(sources, device=self.device)
            moved = self.kv_cache.index_select(3, source)                   # [layers, 2, kv_heads, n, head_dim]
            self.kv_cache.index_copy_(3, torch.tensor(targets, device=self.device), moved)

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    def _record_logprobs(self, logits: torch.Tensor, seqs: list[Sequence], token_rows: list[list[int]],
                         emitted: list[list[int]]) -> None:
        """Logprobs of emitted token j come from its row token_rows[i][j]: the target's processed logits there."""
        self.step_logprobs = {}
        for seq, rows, tokens in zip(seqs, token_rows, emitted):
            if seq.sampling_params.logprobs is not None:
                index = torch.tensor(rows[:len(tokens)], device=logits.device)
                self.step_logprobs[seq.seq_id] = token_logprobs(logits[index], tokens, seq.sampling_params.logprobs)

    def probs(self, logits: torch.Tensor, seqs: list[Sequence],
              drafts_before: list[list[int]] | None = None) -> torch.Tensor:
        """Sampling distribution per position: logits [num_seqs, q_len, vocab] -> same shape, fp32.

        Row (i, j) follows seqs[i].token_ids + drafts_before[i] + (nothing more: q_len is 1 when
        drafts_before is given, as a drafter samples); without it, every row follows the sequence."""
        num_seqs, q_len, vocab_size = logits.shape
        extra = drafts_before or [[] for _ in seqs]
        rows = [Row(seq, list(drafts)) for seq, drafts in zip(seqs, extra) for _ in range(q_len)]
        processed = self.processing.apply(logits.reshape(-1, vocab_size), rows)
        return self.distribution(processed.view(num_seqs, q_len, vocab_size), seqs)

    def distribution(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Temperature, top-k, top-p of already processed logits [num_seqs, q_len, vocab] -> probs, fp32."""
        num_seqs, q_len, vocab_size = logits.shape
        sampling = SamplingTensors.from_params([seq.sampling_params for seq in seqs], q_len, self.device)
        return logits_to_probs(logits.reshape(-1, vocab_size), sampling).view(num_seqs, q_len, vocab_size)

    def rng_states(self, seqs: list[Sequence]) -> dict[int, torch.Tensor]:
        """The random streams of seqs that have one, to put back if their step is retried."""
        return {seq.seq_id: self.generators[seq.seq_id].get_state() for seq in seqs if seq.seq_id in self.generators}

    def restore_rng(self, seqs: list[Sequence], states: dict[int, torch.Tensor]) -> None:
        for seq in seqs:
            if seq.seq_id in states:
                self.generators[seq.seq_id].set_state(states[seq.seq_id])
            else:
                self.generators.pop(seq.seq_id, None)        # made during the failed attempt: made afresh

    def generator(self, seq: Sequence) -> torch.Generator:
        if seq.seq_id not in self.generators:
            self.generators[seq.seq_id] = request_generator(seq.seed, self.device)
        return self.generators[seq.seq_id]

    def release(self, seq: Sequence) -> None:
        if seq.is_finished:
            self.generators.pop(seq.seq_id, None)
            self.step_logprobs.pop(seq.seq_id, None)
            self.prompt_logprobs.pop(seq.seq_id, None)
            self.processing.release(seq)


def check_finite(logits: torch.Tensor, rows: list[Row]) -> None:
    """RequestFault naming the sequences with a row of processed logits [len(rows), vocab] whose maximum is not
    finite: a NaN (the max propagates it), +inf, or every token masked. Sampling there would be garbage."""
    finite = torch.isfinite(logits.amax(dim=-1)).tolist()
    if not all(finite):
        seqs = list({id(row.seq): row.seq for row, ok in zip(rows, finite) if not ok}.values())
        raise RequestFault(seqs, "the target's logits have no finite maximum (a NaN, or every token masked)")


def token_logprobs(logits: torch.Tensor, tokens: list[int], num_top: int) -> list[TokenLogprob]:
    """logits [len(tokens), vocab] -> each token's log_softmax value and the num_top most likely."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)                                # [len(tokens), vocab]
    chosen = logprobs.gather(1, torch.tensor(tokens, device=logprobs.device).unsqueeze(1)).squeeze(1)
    top_values, top_ids = logprobs.topk(num_top, dim=-1) if num_top else (logprobs[:, :0], logprobs[:, :0])
    return [TokenLogprob(token, value, list(zip(ids, values)))
            for token, value, ids, values in zip(tokens, chosen.tolist(), top_ids.long().tolist(), top_values.tolist())]
