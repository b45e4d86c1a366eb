"""benchmarks/make_corpus.py: which files give text, how it is chunked, and what is dropped (short,
not prose, duplicate, shared with the evaluation suite), on files written here."""

import importlib.util
import json
from pathlib import Path

from specwise.bench.inputs.suite import load_suite

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "make_corpus.py"
spec = importlib.util.spec_from_file_location("make_corpus", SCRIPT)
make_corpus = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_corpus)

PROSE = ("The scheduler admits requests while blocks are free and preempts the newest one when the "
         "cache runs out, so that older requests finish first and memory is returned sooner.")


def test_files_give_docs_docstrings_and_descriptions_and_skip_licenses_and_tests(tmp_path):
    (tmp_path / "README.md").write_text("# Title\n\nA readme paragraph.\n")
    (tmp_path / "LICENSE.txt").write_text("Permission is hereby granted, free of charge ...\n")
    (tmp_path / "module.py").write_text('"""Module doc."""\n\nclass A:\n    """Class doc."""\n\n'
                                        '    def f(self):\n        """Function doc."""\n\nx = "not a docstring"\n')
    (tmp_path / "broken.py").write_text('"""Never read: the file does not parse."""\ndef (:\n')
    (tmp_path / "pkg.dist-info").mkdir()
    (tmp_path / "pkg.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: pkg\n\nThe description.\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "notes.md").write_text("Test fixture text.\n")
    (tmp_path / "data.bin").write_bytes(b"\x00\x01")

    documents = make_corpus.collect_documents([tmp_path])

    assert sorted(text.strip() for _, text in documents) == sorted(
        ["# Title\n\nA readme paragraph.", "Module doc.", "Class doc.", "Function doc.", "The description."])
    assert {Path(source).name for source, _ in documents} == {"README.md", "module.py", "METADATA"}


def test_chunks_are_whole_paragraphs_up_to_the_limit():
    text = "aaaa\n\nbbbb\n\ncccc\n\n" + "d" * 25
    # 4 + 2 + 4 = 10 fits 12; adding "cccc" would make 16; the 25-character line is cut at 12
    assert make_corpus.paragraphs_to_chunks(text, 12) == ["aaaa\n\nbbbb", "cccc", "d" * 12, "d" * 12, "d"]
    lines = "line one\nline two\nline three"
    assert make_corpus.paragraphs_to_chunks(lines, 18) == ["line one\nline two", "line three"]


def test_short_numeric_duplicate_and_leaked_chunks_are_dropped():
    suite_prompt = "Explain to a curious eight-year-old why the sky turns orange and red at sunset."
    leaked = PROSE + " Explain to a curious eight-year-old why the sky turns orange, he said."   # 12 words shared
    near = PROSE.replace("scheduler", "planner") + " Why the sky turns orange and red is another story."  # 7
    documents = [("a", PROSE), ("b", "  " + PROSE.upper() + "\n"), ("c", "too short"),
                 ("d", " ".join(str(i * 7919 % 1000) for i in range(200))), ("e", leaked), ("f", near)]

    rows, dropped = make_corpus.build_chunks(documents, [suite_prompt], chunk_chars=1600, min_chars=50,
                                             leak_words=8)

    assert rows == [{"text": PROSE, "source": "a"}, {"text": near, "source": "f"}]
    assert dropped == {"short": 1, "not prose": 1, "duplicate": 1, "leak": 1}


def test_the_leak_filter_is_fed_every_prompt_and_answer_of_the_evaluation_suite():
    texts = "\n".join(make_corpus.suite_texts())
    for request in load_suite():
        for message in request.messages or []:
            assert message["content"] in texts
        if request.prompt:
            assert request.prompt in texts


def test_the_written_file_is_what_train_drafter_reads(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text(PROSE + "\n\n" + PROSE.replace("newest", "oldest") + "\n")
    out = tmp_path / "corpus.jsonl"
    monkeypatch.setattr("sys.argv", ["make_corpus.py", "--out", str(out), "--root", str(tmp_path / "docs"),
                                     "--chunk-chars", "200", "--min-chars", "50"])
    monkeypatch.setattr(make_corpus, "help_topics", lambda: [])

    make_corpus.main()

    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(row["text"] for row in rows) == sorted([PROSE, PROSE.replace("newest", "oldest")])
    assert all(row["source"].endswith("guide.md") for row in rows)
