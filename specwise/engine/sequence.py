"""A request's tokens and bookkeeping, as the scheduler and block manager see it (no torch)."""

import enum
import itertools

from specwise.sampling_params import SamplingParams
from specwise.engine.spec_decode.metrics import SpecStats


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    _ids = itertools.count()

    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
                 seed: int = 0, tenant: str | None = None):
        self.seq_id = next(Sequence._ids)
        self.seed = seed if sampling_params.seed is None else sampling_params.seed
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.sampling_params = sampling_params
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        # K/V in the cache is valid for positions [0, num_computed_tokens); the last token
        # of a running sequence is never computed yet: it is the next step's input.
        self.num_computed_tokens = 0
        self.finish_reason: str | None = None
        self.num_preemptions = 0
        self.spec = SpecStats()
        # whose text this is, for drafters that remember responses across requests (suffix's global
        # cache never drafts one tenant's text for another); None = the one default tenant
        self.tenant = tenant

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[:self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def uncomputed_token_ids(self) -> list[int]:
        """The tokens the next forwards must feed (the rest of the prompt at prefill, else the last)."""
        return self.token_ids[self.num_computed_tokens:]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """More than the last token still to compute: a prompt (or a preempted sequence) in chunks."""
        return self.num_uncomputed_tokens > 1
