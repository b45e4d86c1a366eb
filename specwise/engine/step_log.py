"""Every step the engine runs, one JSON line each (GET /steps on `specwise serve`, and `--step-log FILE`):
what a step-cost model is fitted to and held against.

A client sees a server's steps only through its streamed chunks (bench/calibrate/samples.py); the engine
sees each one whole. A line holds what the step computed and how long drafting, the forward and the
verification took together:

    {"start": 12.345678, "seconds": 0.0712, "fed": [1, 1, 5, 212], "cached": [310, 88, 140, 0],
     "sampled": 7, "prompt_tokens": 212}

fed[i]: rows sequence i was fed (its decode row and the drafts its drafter proposed, or a prompt chunk;
a failed sequence's drafts are not counted); cached[i]: tokens it had cached before the step; sampled:
rows whose next-token distribution was sampled (a decode row and its drafts, a prompt chunk only at its
prompt's end: here the 212-token chunk is not its prompt's last);
prompt_tokens: the rows of prompt chunks; start: time.perf_counter() at the step's start.
`benchmarks/step_log_check.py` costs each line with a profile (`StepShape.of(fed, cached, kv_reads)`) and
prints the errors by kind of step and batch size.
"""

import itertools
import json
import threading
import time
from collections import deque

from specwise.engine.scheduler import ScheduledBatch

# lines kept in memory for GET /steps, as JSON text (about 100 bytes, 8 more a sequence: 13 MB at batch 64): a
# 3-minute sweep ran 344-377 steps a server on the 2-core VM; this holds one of 9 ms steps
KEPT_STEPS = 20_000


class StepLog:
    """The engine's steps: the last KEPT_STEPS in memory, numbered from 0 (what `specwise serve` answers
    on GET /steps, and `calibrate --endpoint` fits), and every one in a file where a path is given."""

    def __init__(self, path: str | None = None, keep: int = KEPT_STEPS):
        # a line a step, kept if the server dies
        self.stream = open(path, "a", encoding="utf-8", buffering=1) if path else None
        self.recent: deque[str] = deque(maxlen=keep)
        self.written = 0                   # lines so far; the next one's number
        self.lock = threading.Lock()       # the engine thread writes, the server's reads

    def write(self, batch: ScheduledBatch, draft_rows: list[int], start: float) -> None:
        """One step's line, written before the step advances its sequences; it took from `start`
        (time.perf_counter()) to now. draft_rows[i]: the draft rows sequence i was fed, as its drafter
        proposed them: the scheduler's room (batch.num_draft_tokens) is an upper bound, which an n-gram
        drafter that finds no match leaves empty."""
        seconds = time.perf_counter() - start
        fed = [new + rows for new, rows in zip(batch.num_new_tokens, draft_rows)]
        cached = [seq.num_computed_tokens for seq in batch.seqs]
        sampled = sum(1 + draft_rows[i] for i in range(len(batch.seqs)) if batch.samples(i))
        prompt = sum(new for seq, new in zip(batch.seqs, batch.num_new_tokens) if seq.is_prefilling)
        line = json.dumps({"start": round(start, 6), "seconds": round(seconds, 6), "fed": fed, "cached": cached,
                           "sampled": sampled, "prompt_tokens": prompt})
        with self.lock:
            self.recent.append(line)
            self.written += 1
        if self.stream:
            self.stream.write(line + "\n")

    def since(self, number: int, limit: int | None = None) -> tuple[list[dict], int]:
        """(the kept lines numbered `number` on, at most `limit` of them; the next line's number). Lines past
        the memory are gone: the first returned is then a later one (the caller compares counts)."""
        with self.lock:
            first = max(number - (self.written - len(self.recent)), 0)
            kept = list(itertools.islice(self.recent, first, None if limit is None else first + limit))
            following = self.written
        return [json.loads(line) for line in kept], following
