"""One request against one target -> one RequestRecord: the single place timing and
token counting happen, whatever the target.

Token counts: the server's usage when it reports one, else the local tokenizer on the
streamed text, else the tokens the chunks said they carried, else one per chunk; the
same rule for every arm.
"""

import asyncio
import time
from dataclasses import dataclass
from typing import Protocol

from specwise.bench.results import RequestRecord
from specwise.bench.load.targets.base import Acceptance, Target, TokenChunk, Usage
from specwise.bench.inputs.request import WorkloadRequest


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


@dataclass
class Slot:
    """Where a request sits in the run: which load point, relative to which start."""
    load_kind: str
    load_value: float
    run_start: float            # time.perf_counter() at the start of the run
    warmup: bool = False
    round: int | None = None    # the round of the load point (bench/load/schedule.py)


async def measure(target: Target, request: WorkloadRequest, slot: Slot, timeout: float,
                  tokenizer: Tokenizer | None = None) -> RequestRecord:
    chunks: list[TokenChunk] = []
    usage: Usage | None = None
    acceptance: Acceptance | None = None
    error = None
    sent = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            async for event in target.stream(request):
                if isinstance(event, TokenChunk):
                    chunks.append(event)
                elif isinstance(event, Usage):
                    usage = event
                elif isinstance(event, Acceptance):
                    acceptance = event
    except TimeoutError:
        error = f"timed out after {timeout:g}s"
    except Exception as failure:        # every failure is counted, never raised
        error = str(failure) or type(failure).__name__
    ended = time.perf_counter()
    if error is None and not chunks:
        error = "no output tokens received"
    record = RequestRecord(
        arm=target.name, method=target.method, load_kind=slot.load_kind, load_value=slot.load_value,
        category=request.category, request_id=request.request_id,
        prompt_tokens=_prompt_tokens(request, usage, tokenizer),
        output_tokens=_output_tokens(chunks, usage, tokenizer),
        send_time=sent - slot.run_start, ttft=chunks[0].time - sent if chunks else None,
        e2e=ended - sent, chunk_times=[chunk.time - sent for chunk in chunks],
        chunk_tokens=_chunk_tokens(chunks), error=error, warmup=slot.warmup, round=slot.round)
    if acceptance is not None:
        record.drafts = acceptance.drafts
        record.draft_tokens = acceptance.draft_tokens
        record.accepted_tokens = acceptance.accepted_tokens
        record.accepted_per_position = list(acceptance.accepted_per_position)
    return record


def _output_tokens(chunks: list[TokenChunk], usage: Usage | None, tokenizer: Tokenizer | None) -> int:
    if usage is not None and usage.completion_tokens is not None:
        return usage.completion_tokens
    if tokenizer is not None:
        return len(tokenizer.encode("".join(chunk.text for chunk in chunks), add_special_tokens=False))
    known = _chunk_tokens(chunks)
    return sum(known) if known else len(chunks)


def _prompt_tokens(request: WorkloadRequest, usage: Usage | None, tokenizer: Tokenizer | None) -> int:
    if usage is not None and usage.prompt_tokens is not None:
        return usage.prompt_tokens
    if request.prompt_tokens is not None:
        return request.prompt_tokens
    if tokenizer is not None:
        text = request.prompt or "\n".join(m["content"] for m in request.messages or [])
        return len(tokenizer.encode(text, add_special_tokens=False))
    return 0


def _chunk_tokens(chunks: list[TokenChunk]) -> list[int]:
    """Per-chunk token counts when the target reported every one, else []."""
    if chunks and all(chunk.tokens is not None for chunk in chunks):
        return [chunk.tokens for chunk in chunks]
    return []
