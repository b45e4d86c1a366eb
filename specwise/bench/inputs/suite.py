"""The built-in workload suite: prompts written for this project, by category.

The categories are where speculation behaves differently: output that copies the
prompt (code editing, summarization / RAG, extraction to JSON) gives n-gram drafting
something to match; free-form output (chat, creative writing, math, translation)
leaves only model-based drafters. `agentic` is multi-turn: sessions (tool-call JSON, SQL
refinement, code-agent edit loops, RAG answers quoting their context) whose later turns repeat
or edit earlier answers; each line carries the whole conversation so far, with a reference
answer per earlier turn, plus "session" and "turn" (kept in `extra`), and session replay
(bench/load/sessions.py) swaps the reference answers for the ones the run produced.
Data lives in `data/suite/<category>.jsonl`, in the user workload format (see workloads.py).
"""

import copy
from functools import lru_cache
from pathlib import Path

from specwise.bench.inputs.request import WorkloadRequest
from specwise.bench.inputs.workload_file import read_workload
from specwise.errors import InputError

DATA_DIR = Path(__file__).parent / "data" / "suite"
CATEGORIES = ("code_editing", "summarization", "extraction", "chat", "math", "translation", "agentic")


def load_suite(categories=None, per_category: int | None = None) -> list[WorkloadRequest]:
    """Suite requests for `categories` (all by default), interleaved round-robin.

    Interleaving makes any prefix of the list cover every category, so a run bounded
    by request count still reports each category.
    """
    names = check_categories(categories)
    groups = [_category_requests(name)[:per_category] for name in names]
    interleaved = []
    for index in range(max(len(group) for group in groups)):
        interleaved.extend(group[index] for group in groups if index < len(group))
    return copy.deepcopy(interleaved)


def category_text(category: str) -> str:
    """All text of a category's prompts, for synthesizing trace prompts of a given length."""
    check_categories([category])
    parts = []
    for request in _category_requests(category):
        if request.prompt:
            parts.append(request.prompt)
        parts.extend(message["content"] for message in request.messages or [])
    return "\n\n".join(parts)


def parse_categories(text: str | None) -> list[str] | None:
    """`"code_editing,chat"` -> the list; None or "" or "all" -> None (every category)."""
    if not text or text == "all":
        return None
    return check_categories([name.strip() for name in text.split(",") if name.strip()])


def check_categories(categories) -> list[str]:
    names = list(CATEGORIES if categories is None else categories)
    unknown = [name for name in names if name not in CATEGORIES]
    if unknown or not names:
        raise InputError(f"unknown suite category {', '.join(unknown) or '(none)'}; "
                         f"choose from {', '.join(CATEGORIES)}")
    return names


@lru_cache(maxsize=None)
def _category_requests(category: str) -> tuple[WorkloadRequest, ...]:
    return tuple(read_workload(DATA_DIR / f"{category}.jsonl", default_category=category))


