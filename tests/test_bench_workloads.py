"""User JSONL workloads, the built-in suite, and prompt synthesis for trace replay."""

import json

import pytest

from specwise.bench.inputs.bad_rows import BadRows
from specwise.bench.inputs.suite import CATEGORIES, category_text, load_suite, parse_categories
from specwise.bench.inputs.synthetic import CHARS_PER_TOKEN, synthesize_prompts
from specwise.bench.inputs.request import WorkloadRequest
from specwise.bench.inputs.workload_file import read_workload
from specwise.errors import InputError


def write_lines(path, *rows):
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def test_prompt_and_messages_lines(tmp_path):
    path = write_lines(tmp_path / "w.jsonl",
                       {"prompt": "Summarize: the cat sat.", "max_tokens": 50, "category": "rag"},
                       {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                        "id": "greeting", "temperature_hint": 0.3})
    first, second = read_workload(path)
    assert (first.prompt, first.max_tokens, first.category, first.request_id) == (
        "Summarize: the cat sat.", 50, "rag", "w:1")
    assert second.messages[1]["content"] == "Hi" and second.prompt is None
    assert (second.max_tokens, second.category, second.request_id) == (128, "custom", "greeting")
    assert second.extra == {"temperature_hint": 0.3}
    assert first.arrival_time is None


def test_timestamps_become_relative_arrivals(tmp_path):
    path = write_lines(tmp_path / "w.jsonl", {"prompt": "a", "timestamp": 100.5}, {"prompt": "b", "timestamp": 100.0},
                       {"prompt": "c", "timestamp": 103})
    assert [r.arrival_time for r in read_workload(path)] == [0.5, 0.0, 3.0]


@pytest.mark.parametrize("line, problem", [
    ('{"max_tokens": 5}', "give exactly one of 'prompt'"),
    ('{"prompt": "x", "messages": []}', "give exactly one of 'prompt'"),
    ('{"prompt": "x", "max_tokens": 0}', "max_tokens must be >= 1, got 0"),
    ('{"prompt": "x", "max_tokens": "many"}', "max_tokens must be an integer"),
    ('{"messages": [{"role": "robot", "content": "x"}]}', "messages[0].role must be one of"),
    ('{"messages": [{"role": "user"}]}', "messages[0] must be an object with a string 'content'"),
    ('{"prompt": "x", "timestamp": -4}', "'timestamp' must be a number of seconds >= 0"),
    ('[1, 2]', "expected a JSON object"),
    ('{"prompt": "x"', "not valid JSON"),
])
def test_malformed_lines_name_file_and_line(tmp_path, line, problem):
    path = write_lines(tmp_path / "w.jsonl", {"prompt": "fine"}, line)
    with pytest.raises(InputError) as caught:
        read_workload(path)
    assert str(caught.value).startswith(f"{path}:2: {problem}")


def test_skipping_bad_lines_counts_them(tmp_path):
    path = write_lines(tmp_path / "w.jsonl", {"prompt": "a"}, "oops", {"prompt": ""}, {"prompt": "b"})
    rows = BadRows()
    requests = read_workload(path, skip_bad_rows=True, bad_rows=rows)
    assert [r.prompt for r in requests] == ["a", "b"]
    assert rows.count == 2


def test_timestamps_on_some_lines_only_is_an_error(tmp_path):
    path = write_lines(tmp_path / "w.jsonl", {"prompt": "a", "timestamp": 1}, {"prompt": "b"})
    with pytest.raises(InputError, match="give it on all or none"):
        read_workload(path)


def test_suite_has_every_category_with_enough_prompts():
    requests = load_suite()
    for category in CATEGORIES:
        mine = [r for r in requests if r.category == category]
        assert len(mine) >= 8, category
        assert all(r.messages and r.messages[-1]["role"] == "user" and r.max_tokens >= 64 for r in mine)
    assert len({r.request_id for r in requests}) == len(requests)


def test_suite_is_interleaved_and_selectable():
    first_round = [r.category for r in load_suite()[:len(CATEGORIES)]]
    assert first_round == list(CATEGORIES)
    two = load_suite(["math", "code_editing"], per_category=3)
    assert [r.category for r in two] == ["math", "code_editing"] * 3
    two[0].messages[0]["content"] = "changed"
    assert load_suite(["math"])[0].messages[0]["content"] != "changed"
    assert parse_categories("all") is None and parse_categories("chat, math") == ["chat", "math"]
    with pytest.raises(InputError, match="unknown suite category poetry"):
        load_suite(["poetry"])


def test_code_editing_prompts_carry_code_to_copy():
    code = [r for r in load_suite(["code_editing"])]
    assert all("```" in r.messages[0]["content"] for r in code)
    assert "def " in category_text("code_editing") and "function " in category_text("code_editing")


class WordTokenizer:
    """One token per space-separated word; decode joins with spaces."""
    def __init__(self):
        self.vocab = {}

    def encode(self, text, add_special_tokens=True):
        return [self.vocab.setdefault(word, len(self.vocab)) for word in text.split()]

    def decode(self, ids):
        words = {index: word for word, index in self.vocab.items()}
        return " ".join(words[i] for i in ids)


def trace_requests(*shapes):
    return [WorkloadRequest(f"t:{i}", "trace", max_tokens=out, prompt_tokens=prompt, arrival_time=float(i),
                            ignore_eos=True) for i, (prompt, out) in enumerate(shapes)]


def test_synthesized_prompts_have_the_trace_lengths():
    tokenizer = WordTokenizer()
    requests = synthesize_prompts(trace_requests((30, 5), (7, 3)), "summarization", tokenizer)
    assert [len(r.extra["prompt_token_ids"]) for r in requests] == [30, 7]
    assert [len(tokenizer.encode(r.prompt)) for r in requests] == [30, 7]
    assert requests[0].prompt != requests[1].prompt[:len(requests[0].prompt)]
    assert all(r.ignore_eos and r.max_tokens in (5, 3) and not r.extra.get("clipped") for r in requests)


def test_synthesis_clips_to_the_context_and_falls_back_to_characters():
    clipped = synthesize_prompts(trace_requests((3000, 900), (100, 10)), "chat", max_total_tokens=1000)
    assert (clipped[0].prompt_tokens, clipped[0].max_tokens, clipped[0].extra["clipped"]) == (500, 500, True)
    assert len(clipped[0].prompt) == 500 * CHARS_PER_TOKEN
    assert (clipped[1].prompt_tokens, clipped[1].max_tokens) == (100, 10) and "clipped" not in clipped[1].extra
    text_prompt = WorkloadRequest("p", "chat", prompt="already here")
    assert synthesize_prompts([text_prompt], "chat") == [text_prompt]
