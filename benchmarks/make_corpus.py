"""A `train-drafter --corpus` file from English text already on this machine (no network).

    python benchmarks/make_corpus.py --out /tmp/data32/corpus.jsonl            # ~1M tokens or more
    python benchmarks/make_corpus.py --out corpus.jsonl --root DIR --root DIR2   # other folders

Sources, in this order before the shuffle: the interpreter's own help topics (pydoc_data.topics,
the text of the language reference `help()` shows), then under each --root (default: the standard
library and the running environment's site-packages, then /usr/share/doc) documentation files
(.md, .rst, .txt, README*, a wheel's METADATA description) and the docstrings of .py modules
(module, class and function docstrings, read with ast, never imported). License and changelog
files are skipped (legal boilerplate and version lists, not prose).

Each document is cut into chunks of whole paragraphs, at most --chunk-chars characters (~4
characters a token: 1,600 is ~400 tokens, so train-drafter's 512-token batches pack them). A chunk
is dropped when it is shorter than --min-chars, when it is not prose (less than --min-letters of
its non-space characters letters: tables of numbers, code), when its normalised text (lower case, whitespace
collapsed) was already kept (vendored copies of one package, repeated docstrings), or when it
shares a run of --leak-words words with any prompt or reference answer of the built-in evaluation
suite (specwise/bench/inputs/data/suite/): the prompts acceptance is measured on never enter
training. The chunks are then shuffled (--seed) so any prefix (`--corpus-tokens N` reads the file
in order) mixes all sources, and written as {"text": ..., "source": ...} lines.

This is technical documentation (Python, its libraries, Debian packages), not conversation: its
domain differs from the suite's chat and math, which is what a drafter is measured on.
"""

import argparse
import ast
import gzip
import hashlib
import json
import random
import re
import sys
import sysconfig
from pathlib import Path

DOC_SUFFIXES = (".md", ".rst", ".txt")
SKIPPED_NAMES = re.compile(r"^(licen[cs]e|copying|copyright|notice|authors|changelog|changes|history|news|"
                           r"record|top_level|entry_points|sources|requires|dependency_links|installer|wheel)",
                           re.IGNORECASE)
SKIPPED_FOLDERS = {"test", "tests", "testing", "__pycache__"}      # test data: numbers, fixtures, not prose
WORD = re.compile(r"[a-z0-9]+")


def suite_texts() -> list[str]:
    """Every prompt, message and reference answer of the built-in evaluation suite."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from specwise.bench.inputs.suite import CATEGORIES, category_text
    return [category_text(category) for category in CATEGORIES]


def paragraphs_to_chunks(text: str, chunk_chars: int) -> list[str]:
    """Whole paragraphs (blank-line separated) packed into chunks of at most chunk_chars characters; a
    longer paragraph is cut at line ends (or, a single long line, at chunk_chars)."""
    pieces = []
    for paragraph in re.split(r"\n\s*\n", text.replace("\r\n", "\n")):
        paragraph = paragraph.strip("\n")
        if not paragraph.strip():
            continue
        while len(paragraph) > chunk_chars:
            cut = paragraph.rfind("\n", 0, chunk_chars)
            cut = cut if cut > 0 else chunk_chars
            pieces.append(paragraph[:cut])
            paragraph = paragraph[cut:].lstrip("\n")
        pieces.append(paragraph)
    chunks, current = [], ""
    for piece in pieces:
        if current and len(current) + 2 + len(piece) > chunk_chars:
            chunks.append(current)
            current = ""
        current = f"{current}\n\n{piece}" if current else piece
    if current:
        chunks.append(current)
    return chunks


def docstrings(source: str) -> list[str]:
    """Module, class and function docstrings of Python source, cleaned as inspect.cleandoc does
    (none when the file does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=True)
            if text:
                found.append(text)
    return found


def file_documents(path: Path) -> list[str]:
    """The text documents one file holds: a doc file's text, a METADATA file's description (after its
    headers), a .py module's docstrings; nothing for other files or unreadable ones."""
    name = path.name
    if SKIPPED_NAMES.match(name):
        return []
    try:
        if name.endswith(".gz"):
            if not name.lower().startswith("readme"):
                return []
            text = gzip.decompress(path.read_bytes()).decode("utf-8")
        else:
            text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return []
    if name.endswith(".py"):
        return docstrings(text)
    if name == "METADATA" or name == "PKG-INFO":
        _, _, body = text.partition("\n\n")                  # email-style headers, then the description
        return [body] if body.strip() else []
    if name.endswith(DOC_SUFFIXES) or name.lower().startswith("readme"):
        return [text]
    return []


def is_prose(text: str, min_letters: float) -> bool:
    """At least min_letters of the non-space characters are letters (tables of numbers, hex dumps and
    code-heavy chunks are not)."""
    visible = [c for c in text if not c.isspace()]
    return bool(visible) and sum(c.isalpha() for c in visible) >= min_letters * len(visible)


def normalised(text: str) -> str:
    return " ".join(text.lower().split())


def word_windows(text: str, size: int) -> set[tuple[str, ...]]:
    words = WORD.findall(text.lower())
    return {tuple(words[i:i + size]) for i in range(len(words) - size + 1)}


def build_chunks(documents: list[tuple[str, str]], exclude: list[str], chunk_chars: int = 1600,
                 min_chars: int = 200, leak_words: int = 8, min_letters: float = 0.7) -> tuple[list[dict], dict]:
    """Rows {"text", "source"} from (source, text) documents, in document order: chunked, short ones and
    ones that are not prose (is_prose) dropped, duplicates dropped (normalised text), and any chunk sharing
    leak_words consecutive words with a text of `exclude` dropped. Also returns the counts of what was
    dropped, by reason."""
    banned = set()
    for text in exclude:
        banned |= word_windows(text, leak_words)
    seen, rows = set(), []
    dropped = {"short": 0, "not prose": 0, "duplicate": 0, "leak": 0}
    for source, text in documents:
        for chunk in paragraphs_to_chunks(text, chunk_chars):
            if len(chunk.strip()) < min_chars:
                dropped["short"] += 1
                continue
            if not is_prose(chunk, min_letters):
                dropped["not prose"] += 1
                continue
            digest = hashlib.sha256(normalised(chunk).encode()).digest()
            if digest in seen:
                dropped["duplicate"] += 1
                continue
            seen.add(digest)
            if banned and not banned.isdisjoint(word_windows(chunk, leak_words)):
                dropped["leak"] += 1
                continue
            rows.append({"text": chunk.strip(), "source": source})
    return rows, dropped


def collect_documents(roots: list[Path]) -> list[tuple[str, str]]:
    """(source, text) of every document under the roots, files in sorted path order, test folders
    skipped (a root may also be a single file)."""
    documents = []
    for root in roots:
        files = [root] if root.is_file() else sorted(
            p for p in root.rglob("*") if p.is_file() and SKIPPED_FOLDERS.isdisjoint(p.relative_to(root).parts[:-1]))
        for path in files:
            documents += [(str(path), text) for text in file_documents(path)]
    return documents


def default_roots() -> list[Path]:
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"]), Path("/usr/share/doc")]
    return [root for root in dict.fromkeys(roots) if root.exists()]


def help_topics() -> list[tuple[str, str]]:
    from pydoc_data.topics import topics
    return [(f"pydoc_data.topics:{name}", text) for name, text in sorted(topics.items())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the JSONL file to write")
    parser.add_argument("--root", action="append", default=None,
                        help="a folder (or file) to read; repeat for more (default: stdlib, site-packages, "
                             "/usr/share/doc)")
    parser.add_argument("--chunk-chars", type=int, default=1600)
    parser.add_argument("--min-chars", type=int, default=200)
    parser.add_argument("--leak-words", type=int, default=8,
                        help="drop a chunk sharing this many consecutive words with the evaluation suite")
    parser.add_argument("--min-letters", type=float, default=0.7,
                        help="drop a chunk whose non-space characters are less than this fraction letters")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count-tokens", action="store_true",
                        help="count the tokens with the default model's tokenizer (loads it)")
    args = parser.parse_args()
    roots = [Path(root) for root in args.root] if args.root else default_roots()
    documents = help_topics() + collect_documents(roots)
    rows, dropped = build_chunks(documents, suite_texts(), args.chunk_chars, args.min_chars, args.leak_words,
                                   args.min_letters)
    random.Random(args.seed).shuffle(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as sink:
        for row in rows:
            sink.write(json.dumps(row, ensure_ascii=False) + "\n")
    chars = sum(len(row["text"]) for row in rows)
    print(f"wrote {out}: {len(rows)} chunks, {chars} characters from {len(documents)} documents under "
          f"{', '.join(map(str, roots))} (dropped: {dropped})")
    if args.count_tokens:
        from specwise.models.checkpoints.loader import load_checkpoint
        tokenizer = load_checkpoint(None).tokenizer
        tokens = sum(len(tokenizer.encode(row["text"])) for row in rows)
        print(f"{tokens} tokens of the default model's tokenizer ({chars / tokens:.2f} characters a token)")


if __name__ == "__main__":
    main()
