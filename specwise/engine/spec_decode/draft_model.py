"""Draft-model speculation: a smaller model with the target's tokenizer proposes k tokens.

The draft model has its own paged KV cache with as many blocks as the target's and
is addressed through the target's block tables, so the lookahead slots the scheduler
reserves and the blocks it frees serve both. After verification the drafter's K/V is
valid up to the first position where its drafts and the emitted tokens differ; it
re-feeds only what it has not seen (usually one or two tokens).
"""

from specwise.engine.model_runner import ModelRunner, kv_block_bytes
from specwise.engine.spec_decode.context import ProposerContext
from specwise.engine.spec_decode.model_drafter import ModelDrafter
from specwise.engine.spec_decode.proposer import Proposal
from specwise.errors import ConfigError
from specwise.models.checkpoints.loader import build_model, load_checkpoint


class DraftModelProposer:
    def __init__(self, context: ProposerContext, path: str):
        checkpoint = load_checkpoint(path, context.dtype)
        check_same_vocabulary(context.tokenizer, checkpoint.tokenizer, path)
        model = build_model(checkpoint, context.dtype, context.device, context.max_model_len)
        target = context.runner
        runner = ModelRunner(model, target.num_blocks, target.block_size, context.dtype, context.device)
        runner.processing = target.processing     # the target's penalties and grammars shape the drafts too
        self.drafter = ModelDrafter(runner, vocab_size=context.vocab_size)
        self.kv_cache_bytes = kv_block_bytes(model, target.block_size, context.dtype) * target.num_blocks
        # seq_id -> (length when drafted, draft tokens, end of the K/V the drafter wrote)
        self.pending: dict[int, tuple[int, list[int], int]] = {}

    def propose(self, seqs, num_draft_tokens: list[int]) -> Proposal:
        computed = [self._valid_prefix(seq) for seq in seqs]
        proposal = self.drafter.draft(seqs, num_draft_tokens, computed)
        for seq, drafts in zip(seqs, proposal.draft_token_ids):
            if drafts:   # a sequence asked for no drafts was not fed: its old record still holds
                self.pending[seq.seq_id] = (len(seq), drafts, len(seq) + len(drafts) - 1)
        return proposal

    def _valid_prefix(self, seq) -> int:
        """Positions [0, result) of the drafter's cache hold K/V of seq's actual tokens."""
        if seq.seq_id not in self.pending:
            return 0
        length, drafts, written = self.pending[seq.seq_id]
        matched = 0
        while matched < len(drafts) and length + matched < len(seq) and \
                seq.token_ids[length + matched] == drafts[matched]:
            matched += 1
        # the drafter fed every token before `length`, then draft j at position length + j - 1
        # (j = 1 .. k-1): that K/V is valid while the sequence really holds draft j there
        return min(length + matched, written, len(seq) - 1)

    def free(self, seq) -> None:
        self.pending.pop(seq.seq_id, None)
        self.drafter.free(seq)


def check_same_vocabulary(target_tokenizer, draft_tokenizer, path: str) -> None:
    target_vocab = target_tokenizer.backend.get_vocab(with_added_tokens=True)
    draft_vocab = draft_tokenizer.backend.get_vocab(with_added_tokens=True)
    if target_vocab != draft_vocab:
        differing = sum(1 for token, index in draft_vocab.items() if target_vocab.get(token) != index)
        raise ConfigError(f"{path}: the draft model's vocabulary differs from the target's "
                          f"({len(draft_vocab)} vs {len(target_vocab)} tokens, {differing} differ); "
                          f"a draft model must share the target's tokenizer")
