"""The one place that builds tensors: token lists and block tables in, logits and tokens out.

A step feeds each sequence a ragged run of query tokens (the whole prompt at prefill;
the last token plus k_i draft tokens when verifying) padded to [num_seqs, max_query_len].
Keys are gathered from the paged cache by position (see models/attention.py).
"""

import torch

from specwise.engine.sampling.sampler import SamplingTensors, logits_to_probs, request_generator
from specwise.engine.scheduler import ScheduledBatch
from specwise.engine.sequence import Sequence
from specwise.models.attention import AttentionMetadata
from specwise.models.llama import LlamaForCausalLM
from specwise.engine.spec_decode.proposer import Proposal
from specwise.engine.sampling.rejection import greedy_accept, rejection_sample


def kv_block_bytes(model: LlamaForCausalLM, block_size: int, dtype: torch.dtype) -> int:
    config = model.config
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
    return per_token * block_size * torch.tensor([], dtype=dtype).element_size()


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: str = "cpu"):
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = device
        config = model.config
        # one extra block at the end is the scratch target of padded positions
        self.scratch_slot = num_blocks * block_size
        cache_shape = (config.num_hidden_layers, 2, (num_blocks + 1) * block_size,
                       config.num_key_value_heads, config.head_dim)
        self.kv_cache = torch.zeros(cache_shape, dtype=dtype, device=device)
        self.kv_caches = [(layer[0], layer[1]) for layer in self.kv_cache]
        self.generators: dict[int, torch.Generator] = {}

    def blocks_for(self, num_slots: int) -> int:
        return -(-num_slots // self.block_size)

    @torch.inference_mode()
    def forward(self, token_ids: list[list[int]], start_positions: list[int], block_tables: list[list[int]],
                last_only: bool, num_layers: int | None = None) -> torch.Tensor:
        """Run the model over ragged query runs; logits [num_seqs, max_query_len or 1, vocab_size]."""
        input_ids, positions, metadata = self._prepare(token_ids, start_positions, block_tables)
        kv_caches = self.kv_caches if num_layers is None else self.kv_caches[:num_layers]
        hidden = self.model(input_ids, positions, kv_caches, metadata, num_layers)   # [num_seqs, q_len, hidden]
        if last_only:
            rows = torch.arange(len(token_ids), device=self.device)
            last = torch.tensor([len(run) - 1 for run in token_ids], device=self.device)
            hidden = hidden[rows, last].unsqueeze(1)                                # [num_seqs, 1, hidden]
        num_seqs, q_len, hidden_size = hidden.shape
        logits = self.model.compute_logits(hidden.reshape(-1, hidden_size))         # [num_seqs * q_len, vocab]
        return logits.view(num_seqs, q_len, -1)

    def _prepare(self, token_ids, start_positions, block_tables):
        """Index tensors of one step, built from host lists (sizes never read back from the device)."""
        device = self.device
        lens = [len(run) for run in token_ids]
        context_lens_list = [start + length for start, length in zip(start_positions, lens)]
        query_lens = torch.tensor(lens, device=device)                                              # [num_seqs]
        starts = torch.tensor(start_positions, device=device)                                       # [num_seqs]
        max_query_len = max(lens)
        input_ids = torch.tensor([run + [0] * (max_query_len - len(run)) for run in token_ids], device=device)
        offsets = torch.arange(max_query_len, device=device)
        is_query = offsets < query_lens.unsqueeze(1)                                                # [num_seqs, q_len]
        # padded queries sit at the sequence's first query position: harmless and never all-masked
        positions = torch.where(is_query, starts.unsqueeze(1) + offsets, starts.unsqueeze(1))
        context_lens = starts + query_lens
        context_slots = self._context_slots(block_tables, context_lens, max(context_lens_list))   # [num_seqs, ctx]
        slot_mapping = torch.where(is_query, context_slots.gather(1, positions), self.scratch_slot)
        key_positions = torch.arange(context_slots.shape[1], device=device)
        attn_mask = key_positions.view(1, 1, -1) <= positions.unsqueeze(2)                        # [num_seqs, q_len, ctx]
        # one query per sequence over equally long contexts: every key is visible, no mask needed
        unmasked = max_query_len == 1 and len(set(context_lens_list)) == 1
        attn_mask = None if unmasked else attn_mask.unsqueeze(1)
        return input_ids, positions, AttentionMetadata(slot_mapping, context_slots, attn_mask)

    def _context_slots(self, block_tables: list[list[int]], context_lens: torch.Tensor,
                       max_context_len: int) -> torch.Tensor:
        """Cache slot of every key position, [num_seqs, max_context_len]; padding -> scratch slot."""
        max_blocks = max(len(table) for table in block_tables)
        tables = torch.tensor([table + [self.num_blocks] * (max_blocks - len(table)) for table in block_tables],
                              device=self.device)                                                   # [num_seqs, blocks]
        key_positions = torch.arange(max_context_len, device=self.device)
        slots = tables[:, key_positions // self.block_size] * self.block_size + key_positions % self.block_size
        return torch.where(key_positions < context_lens.unsqueeze(1), slots, self.scratch_slot)

    def execute(self, batch: ScheduledBatch, proposal: Proposal | None) -> list[list[int]]:
        """Prefill or verify one scheduled batch; returns the tokens each sequence emits."""
        seqs = batch.seqs
        if batch.is_prefill or proposal is None:
            draft_token_ids = [[] for _ in seqs]
        else:
            draft_token_ids = proposal.draft_token_ids
        token_ids = [seq.uncomputed_token_ids + drafts for seq, drafts in zip(seqs, draft_token_ids)]
        starts = [seq.num_computed_tokens for seq in seqs]
        logits = self.forward(token_ids, starts, [seq.block_table for seq in seqs], last_only=batch.is_prefill)
        greedy = [seq.sampling_params.greedy for seq in seqs]
        if all(greedy):
            return greedy_accept(logits.argmax(dim=-1).tolist(), draft_token_ids)
        target_probs = self.probs(logits, seqs)                             # [num_seqs, 1 + max_k, vocab]
        draft_probs = None if proposal is None else proposal.padded_draft_probs(
            target_probs.shape[1] - 1, target_probs.shape[2], self.device)
        generators = [self.generator(seq) for seq in seqs]
        return rejection_sample(target_probs, draft_token_ids, draft_probs, greedy, generators)

    def probs(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Sampling distribution per position: logits [num_seqs, q_len, vocab] -> same shape, fp32."""
        num_seqs, q_len, vocab_size = logits.shape
        sampling = SamplingTensors.from_params([seq.sampling_params for seq in seqs], q_len, self.device)
        return logits_to_probs(logits.reshape(-1, vocab_size), sampling).view(num_seqs, q_len, vocab_size)

    def generator(self, seq: Sequence) -> torch.Generator:
        if seq.seq_id not in self.generators:
            self.generators[seq.seq_id] = request_generator(seq.seed, self.device)
        return self.generators[seq.seq_id]

    def release(self, seq: Sequence) -> None:
        if seq.is_finished:
            self.generators.pop(seq.seq_id, None)
