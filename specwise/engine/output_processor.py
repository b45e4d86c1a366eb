"""Append emitted tokens to a sequence, detokenize, and decide when it stops."""

from dataclasses import dataclass

from specwise.engine.sequence import Sequence
from specwise.models.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass
class StepResult:
    new_token_ids: list[int]
    new_text: str
    finish_reason: str | None


class OutputProcessor:
    """Per-request detokenizer and stop checks (eos, stop token ids, stop strings, lengths).

    Text that could be the start of a stop string is held back until it is known not to
    be one, so streamed text never has to be taken back.
    """

    def __init__(self, tokenizer: Tokenizer, max_model_len: int):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.detokenizers: dict[int, IncrementalDetokenizer] = {}
        self.texts: dict[int, str] = {}
        self.sent: dict[int, int] = {}

    def add(self, seq: Sequence) -> None:
        self.detokenizers[seq.seq_id] = IncrementalDetokenizer(self.tokenizer, seq.prompt_token_ids)
        self.texts[seq.seq_id] = ""
        self.sent[seq.seq_id] = 0

    def remove(self, seq: Sequence) -> None:
        for table in (self.detokenizers, self.texts, self.sent):
            table.pop(seq.seq_id, None)

    def text(self, seq: Sequence) -> str:
        return self.texts.get(seq.seq_id, "")      # "" once removed (a request failed part-way through finishing)

    def append(self, seq: Sequence, emitted: list[int]) -> StepResult:
        appended, reason = [], None
        for token_id in emitted:
            seq.token_ids.append(token_id)
            appended.append(token_id)
            # token by token, as plain decoding: a stop string ends the output at the token completing it
            reason = self._detokenize(seq, [token_id], self._token_stop(seq, token_id))
            if reason:
                break
        return StepResult(appended, self._release_text(seq, finished=reason is not None), reason)

    def _token_stop(self, seq: Sequence, token_id: int) -> str | None:
        params = seq.sampling_params
        if token_id in params.stop_token_ids:
            return "stop"
        if not params.ignore_eos and token_id in self.tokenizer.eos_token_ids:
            return "stop"
        if seq.num_output_tokens >= params.max_tokens or len(seq) >= self.max_model_len:
            return "length"
        return None

    def _detokenize(self, seq: Sequence, token_ids: list[int], reason: str | None) -> str | None:
        special = set(self.tokenizer.eos_token_ids) | set(seq.sampling_params.stop_token_ids)
        visible = [t for t in token_ids if t not in special]
        text = self.texts[seq.seq_id] + self.detokenizers[seq.seq_id].add(visible)
        # as vLLM: no stop string ends the output before min_tokens (eos and stop tokens are masked)
        stops = seq.sampling_params.stop if seq.num_output_tokens >= seq.sampling_params.min_tokens else []
        for stop in stops:
            # search only where a new match can start: the last len(stop)-1 old chars onwards
            index = text.find(stop, max(0, len(self.texts[seq.seq_id]) - len(stop) + 1))
            if index >= 0:
                text, reason = text[:index], "stop"
        self.texts[seq.seq_id] = text
        return reason

    def _release_text(self, seq: Sequence, finished: bool) -> str:
        text = self.texts[seq.seq_id]
        holdback = 0 if finished else max((len(s) - 1 for s in seq.sampling_params.stop), default=0)
        end = max(self.sent[seq.seq_id], len(text) - holdback)
        new_text = text[self.sent[seq.seq_id]:end]
        self.sent[seq.seq_id] = end
        return new_text
