"""Trace readers: the built-in Azure traces, small Mooncake and BurstGPT samples, malformed rows."""

import statistics
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

import specwise
from specwise.bench.inputs.bad_rows import BadRows
from specwise.bench.inputs.traces import BUILTIN_TRACES, detect_format, read_trace, resolve_trace
from specwise.bench.load.config import LoadConfig
from specwise.bench.load.plan import build_plan
from specwise.errors import InputError

AZURE = BUILTIN_TRACES["azure-code"].parent       # inside the package, never ../shared


def test_builtin_traces_ship_inside_the_package_with_their_attribution():
    package = Path(specwise.__file__).parent
    for name, path in BUILTIN_TRACES.items():
        assert resolve_trace(name) == path and path.is_file()
        assert package in path.parents
    attribution = (AZURE / "README.md").read_text()
    assert "CC-BY 4.0" in attribution and "Splitwise" in attribution
    # and pyproject's package-data ships them (and the README) in a wheel
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["specwise"]
    for path in (*BUILTIN_TRACES.values(), AZURE / "README.md"):
        assert any(fnmatch(path.relative_to(package).as_posix(), glob) for glob in globs)


@pytest.mark.parametrize("name, rows", [("azure-code", 8819), ("azure-conv", 19366)])
def test_trace_flag_takes_a_builtin_name(name, rows):
    plan = build_plan(LoadConfig(trace=name))
    assert len(plan.workload) == rows
    assert plan.info["source"] == f"trace {name}" and plan.info["requests"] == rows
    assert [point.kind for point in plan.loads] == ["trace"]


def test_unknown_trace_name_lists_the_builtin_ones(tmp_path):
    with pytest.raises(InputError, match="azure-cod: no such trace file; built-in traces: azure-code, azure-conv"):
        build_plan(LoadConfig(trace="azure-cod"))
    path = tmp_path / "azure-code.csv"                # a user's file keeps working, whatever its name
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.98,12,3\n")
    assert [(r.prompt_tokens, r.max_tokens) for r in build_plan(LoadConfig(trace=str(path))).workload] == [(12, 3)]


@pytest.mark.parametrize("name, rows, prompt_median, output_median", [
    ("code", 8819, 1469, 13), ("conv", 19366, 1020, 129)])
def test_azure_traces_match_their_published_shape(name, rows, prompt_median, output_median):
    requests = read_trace(AZURE / f"{name}.csv")
    assert detect_format(AZURE / f"{name}.csv") == "azure"
    assert len(requests) == rows
    assert statistics.median(r.prompt_tokens for r in requests) == prompt_median
    assert statistics.median(r.max_tokens for r in requests) == output_median
    assert requests[0].arrival_time == 0.0
    assert 3400 < requests[-1].arrival_time < 3600          # about one hour
    assert all(r.ignore_eos and r.prompt is None and r.category == "trace" for r in requests)


def test_azure_first_rows_and_sub_second_timestamps():
    requests = read_trace(AZURE / "code.csv")
    first, second = requests[:2]
    assert (first.prompt_tokens, first.max_tokens) == (4808, 10)
    assert (second.prompt_tokens, second.max_tokens) == (3180, 8)
    # 18:17:03.9799600 -> 18:17:04.0319600
    assert second.arrival_time == pytest.approx(0.052, abs=1e-6)
    assert first.request_id == "code:2"


def test_mooncake_sample(tmp_path):
    path = tmp_path / "mooncake.jsonl"
    path.write_text('{"timestamp": 1000, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]}\n'
                    '{"timestamp": 11535, "input_length": 672, "output_length": 26, "hash_ids": [46, 47]}\n'
                    "\n"
                    '{"timestamp": 28482, "input_length": 655, "output_length": 52}\n')
    requests = read_trace(path)
    assert detect_format(path) == "mooncake"
    assert [r.arrival_time for r in requests] == [0.0, 10.535, 27.482]
    assert [(r.prompt_tokens, r.max_tokens) for r in requests] == [(655, 52), (672, 26), (655, 52)]
    assert [r.extra["trace_line"] for r in requests] == [1, 2, 4]


BURSTGPT = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "5,ChatGPT,472,18,490,Conversation log\n"
            "45,ChatGPT,1087,0,1087,Conversation log\n"
            "118,GPT-4,417,276,693,API log\n")


def test_burstgpt_sample_drops_failed_requests(tmp_path):
    path = tmp_path / "burst.csv"
    path.write_text(BURSTGPT)
    rows = BadRows()
    requests = read_trace(path, bad_rows=rows)
    assert detect_format(path) == "burstgpt"
    assert [(r.arrival_time, r.prompt_tokens, r.max_tokens) for r in requests] == [(0.0, 472, 18), (113.0, 417, 276)]
    assert rows.empty == 1 and rows.count == 0


def test_malformed_csv_row_names_file_and_line(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:17:03.9799600,4808,10\n"
                    "2023-11-16 18:17:04.0319600,lots,8\n")
    with pytest.raises(InputError, match=rf"{path}:3: ContextTokens must be an integer, got 'lots'"):
        read_trace(path)


def test_bad_timestamp_and_bad_json_lines(tmp_path):
    azure = tmp_path / "a.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,5\n")
    with pytest.raises(InputError, match=rf"{azure}:2: TIMESTAMP 'yesterday'"):
        read_trace(azure)
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text('{"timestamp": 0, "input_length": 5, "output_length": 5}\n{"timestamp": 1,\n')
    with pytest.raises(InputError, match=rf"{mooncake}:2: not valid JSON"):
        read_trace(mooncake)
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"timestamp": 0, "input_length": 5}\n')
    with pytest.raises(InputError, match=rf"{missing}:1: missing 'output_length'"):
        read_trace(missing)


def test_skip_bad_rows_counts_them(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 5}\n'
                    'not json\n'
                    '{"timestamp": 10, "input_length": -1, "output_length": 5}\n'
                    '{"timestamp": 2000, "input_length": 7, "output_length": 3}\n')
    rows = BadRows()
    requests = read_trace(path, skip_bad_rows=True, bad_rows=rows)
    assert [r.prompt_tokens for r in requests] == [5, 7]
    assert rows.count == 2
    assert rows.examples == [f"{path}:2: not valid JSON", f"{path}:3: input_length must be >= 1, got -1"]


def test_unknown_format_is_a_clear_error(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("when,prompt,answer\n1,2,3\n")
    with pytest.raises(InputError, match=rf"{path}:1: cannot tell the trace format"):
        read_trace(path)
    with pytest.raises(InputError, match="no such trace file"):
        read_trace(tmp_path / "absent.csv")
    with pytest.raises(InputError, match="unknown trace format"):
        read_trace(path, fmt="parquet")
