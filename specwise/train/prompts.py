"""Prompts to distill on: the built-in training set (`--data suite`) or a user workload file.

The built-in set (data/prompts/<category>.jsonl, written for this project, 600 prompts: chat,
code, math, summarization, translation, extraction) is disjoint from the evaluation suite in
specwise/bench/inputs/data/suite/, so the acceptance `specwise evaluate` measures there is
held out by construction. Files use the workload format (bench/inputs/workload_file.py) and are
read by its reader, bad-row errors included.
"""

import random
from pathlib import Path

from specwise.bench.inputs.request import WorkloadRequest
from specwise.bench.inputs.workload_file import read_workload

DATA_DIR = Path(__file__).parent / "data" / "prompts"
CATEGORIES = ("chat", "code", "math", "summarization", "translation", "extraction")
BUILT_IN = "suite"


def load_prompts(data: str) -> list[WorkloadRequest]:
    """`suite` -> the built-in training prompts, category by category; else a JSONL workload file."""
    if data == BUILT_IN:
        return [request for name in CATEGORIES for request in read_workload(DATA_DIR / f"{name}.jsonl",
                                                                          default_category=name)]
    return read_workload(Path(data).expanduser())


def split_held_out(requests: list[WorkloadRequest], fraction: float, seed: int) -> list[bool]:
    """held_out[i] for every request: `fraction` of each category (at least one where the category
    has two or more prompts), drawn with `seed`, so every category is measured."""
    by_category: dict[str, list[int]] = {}
    for index, request in enumerate(requests):
        by_category.setdefault(request.category, []).append(index)
    rng = random.Random(seed)
    held_out = [False] * len(requests)
    for category in sorted(by_category):
        members = by_category[category]
        count = max(1, round(len(members) * fraction)) if len(members) > 1 and fraction > 0 else 0
        for index in rng.sample(members, count):
            held_out[index] = True
    return held_out
