"""Time the target's forward pass over a grid of step shapes (no real requests).

Used by `specwise calibrate` (saved as a step profile, see specwise/engine/cost/step_profile.py) and
by the adaptive speculation policy at start-up. A step of `batch_size` sequences with
`tokens_per_seq` query tokens each over `context_len` cached tokens is timed as the
engine runs it: forward, logits at every query position, and the sampling distribution.
Block tables point at arbitrary (possibly shared) blocks: values do not matter for timing.
"""

import time
from typing import Callable

from specwise.engine.cost.step_profile import prefill_prompts
from specwise.engine.model_runner import ModelRunner
from specwise.engine.sequence import Sequence
from specwise.sampling_params import SamplingParams


def time_step(runner: ModelRunner, batch_size: int, tokens_per_seq: int, context_len: int,
              repeats: int = 2, prefill: bool = False) -> float:
    """Median seconds of one step of this shape (after one warm-up run); a prefill step
    computes logits at each sequence's last position only, as the engine does."""
    blocks_per_seq = runner.blocks_for(context_len + tokens_per_seq)
    block_tables = [[(row * blocks_per_seq + index) % runner.num_blocks for index in range(blocks_per_seq)]
                    for row in range(batch_size)]
    token_ids = [[1] * tokens_per_seq for _ in range(batch_size)]
    seqs = [Sequence("profile", [1], SamplingParams(temperature=0))] * batch_size
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        num_logits = 1 if prefill else tokens_per_seq
        logits = runner.forward(token_ids, [context_len] * batch_size, block_tables, [num_logits] * batch_size)
        runner.probs(logits.view(batch_size, num_logits, -1), seqs)
        times.append(time.perf_counter() - started)
    return sorted(times[1:])[len(times[1:]) // 2]


def measure_grid(runner: ModelRunner, batch_sizes: list[int], tokens_per_seq: list[int], context_lens: list[int],
                 repeats: int = 2, on_point: Callable[[], None] | None = None) -> list[list[list[float]]]:
    """seconds[b][t][c] over the grid, the step profile's layout."""
    grid = []
    for batch_size in batch_sizes:
        rows = []
        for tokens in tokens_per_seq:
            row = []
            for context_len in context_lens:
                row.append(time_step(runner, batch_size, tokens, context_len, repeats))
                if on_point:
                    on_point()
            rows.append(row)
        grid.append(rows)
    return grid


def measure_prefill(runner: ModelRunner, total_tokens: list[int], prompt_len: int, repeats: int = 2,
                    on_point: Callable[[], None] | None = None) -> tuple[list[int], list[float]]:
    """Prefill steps of about `total` prompt tokens each, made of prompts of `prompt_len` tokens
    (1024 tokens at prompt_len 256: 4 prompts). Returns the exact totals and their seconds."""
    totals, seconds = [], []
    for total in total_tokens:
        num_prompts, length = prefill_prompts(total, prompt_len)
        if totals and num_prompts * length <= totals[-1]:
            continue                                   # rounds to a total already measured
        totals.append(num_prompts * length)
        seconds.append(time_step(runner, num_prompts, length, 0, repeats, prefill=True))
        if on_point:
            on_point()
    return totals, seconds
