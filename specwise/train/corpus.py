"""`train-drafter --corpus FILE`: text the target reads as it is, no generation, trained on together with
the self-distilled answers to --data.

    {"text": "any document ..."}                                     one row per line; either field
    {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}

Each row becomes token ids (a conversation through the target's chat template, without a generation
prompt), cut into pieces of at most `max_len` tokens; rows are taken in file order until `max_tokens`
tokens are read (the rest of the file is left). data.py then records the target's features over them
by the same teacher-forced forwards as over its own answers, and its greedy token at every position:
what a head learns to draft is still the target's choice, now after a context the target did not
write (where the text differs from what the target would have said, the unrolled steps' later
contexts are the text's, an approximation self-distillation does not need).

Worked example: max_len 4, max_tokens 6, rows "a b c d e" (5 tokens) and "f g h" -> [a b c d], [e],
then [f] (6 tokens read; g h left).
"""

import hashlib
import json
from pathlib import Path

from specwise.errors import InputError
from specwise.models.tokenizer import Tokenizer


def corpus_fingerprint(path: str | Path, max_tokens: int) -> str:
    """What the data cache's key holds for a corpus: its bytes and the token cap."""
    digest = hashlib.sha256(Path(path).expanduser().read_bytes()).hexdigest()
    return f"{digest}:{max_tokens}"


def read_corpus_texts(path: str | Path, tokenizer: Tokenizer, max_tokens: int, max_len: int) -> list[list[int]]:
    """Token-id pieces of the corpus rows, in file order, max_tokens in all (see the module docstring)."""
    path = Path(path).expanduser()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read the corpus: {e}") from None
    pieces, total = [], 0
    for number, line in enumerate(lines, start=1):
        if total >= max_tokens:
            break
        if not line.strip():
            continue
        ids = _row_ids(path, number, line, tokenizer)
        ids = ids[:max_tokens - total]
        total += len(ids)
        pieces += [ids[start:start + max_len] for start in range(0, len(ids), max_len)]
    pieces = [piece for piece in pieces if len(piece) >= 2]        # a pair needs two tokens
    if not pieces:
        raise InputError(f"{path}: no text in the corpus (rows need a non-empty \"text\" or \"messages\")")
    return pieces


def _row_ids(path: Path, number: int, line: str, tokenizer: Tokenizer) -> list[int]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{number}: not JSON: {e.msg}") from None
    if isinstance(row, dict) and isinstance(row.get("text"), str):
        return tokenizer.encode(row["text"])
    messages = row.get("messages") if isinstance(row, dict) else None
    if isinstance(messages, list) and messages and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    raise InputError(f"{path}:{number}: a corpus row needs \"text\" (a string) or \"messages\" (a list of "
                     f"{{\"role\", \"content\"}} strings)")
