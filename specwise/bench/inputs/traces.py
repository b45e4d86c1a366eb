"""Production trace readers: arrival times and token counts, no prompt text.

Formats (auto-detected from the first line):
  azure     CSV `TIMESTAMP,ContextTokens,GeneratedTokens`, TIMESTAMP like
            `2023-11-16 18:17:03.9799600` (Azure LLM inference traces, 2023).
  mooncake  JSONL `{"timestamp": ms, "input_length": n, "output_length": m, ...}`.
  burstgpt  CSV `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`,
            Timestamp in seconds. Rows with 0 response tokens (failed upstream
            requests) carry nothing to replay and are dropped, counted as empty.

Every request gets `arrival_time` in seconds from the first arrival, `prompt_tokens`,
`max_tokens` = the generated length and `ignore_eos=True` (replay forces that length).

Built-in traces, shipped in `data/traces/` with their attribution (CC-BY 4.0):
  azure-code   Azure LLM inference 2023, coding service, one hour, 8,819 requests
  azure-conv   Azure LLM inference 2023, conversation service, one hour, 19,366 requests
`--trace` takes one of these names or a path; a name wins over a file of the same name
(write `./azure-code` for the file).
"""

import csv
from datetime import datetime
from pathlib import Path

from specwise.bench.inputs.bad_rows import BadRows, parse_int, read_jsonl
from specwise.bench.inputs.request import WorkloadRequest
from specwise.errors import InputError

TRACE_FORMATS = ("azure", "mooncake", "burstgpt")
TRACE_DIR = Path(__file__).parent / "data" / "traces"
BUILTIN_TRACES = {
    "azure-code": TRACE_DIR / "azure-llm-2023" / "code.csv",
    "azure-conv": TRACE_DIR / "azure-llm-2023" / "conv.csv",
}
_AZURE_COLUMNS = ("timestamp", "contexttokens", "generatedtokens")
_BURSTGPT_COLUMNS = ("timestamp", "request tokens", "response tokens")


def read_trace(path, fmt: str | None = None, skip_bad_rows: bool = False,
               bad_rows: BadRows | None = None) -> list[WorkloadRequest]:
    """Read a trace (a built-in name or a file); `bad_rows` (optional) collects what was skipped."""
    path = resolve_trace(path)
    fmt = fmt or detect_format(path)
    if fmt not in TRACE_FORMATS:
        raise InputError(f"unknown trace format {fmt!r}; choose one of {', '.join(TRACE_FORMATS)}")
    bad_rows = bad_rows if bad_rows is not None else BadRows(skip=skip_bad_rows)
    bad_rows.skip = bad_rows.skip or skip_bad_rows
    rows = read_jsonl(path, bad_rows, _mooncake_row) if fmt == "mooncake" else _read_csv_rows(path, fmt, bad_rows)
    bad_rows.warn_if_any(path)
    if not rows:
        raise InputError(f"{path}: no usable rows in this {fmt} trace")
    start = min(row[1] for row in rows)
    return [WorkloadRequest(request_id=f"{path.stem}:{line}", category="trace",
                            max_tokens=output, prompt_tokens=prompt, arrival_time=time - start,
                            ignore_eos=True, extra={"trace_format": fmt, "trace_line": line})
            for line, time, prompt, output in rows]


def resolve_trace(trace) -> Path:
    """A built-in trace name or a path -> the file to read; InputError if there is none."""
    if str(trace) in BUILTIN_TRACES:
        return BUILTIN_TRACES[str(trace)]
    path = Path(trace)
    if not path.is_file():
        raise InputError(f"{trace}: no such trace file; built-in traces: {', '.join(BUILTIN_TRACES)}")
    return path


def detect_format(path: Path) -> str:
    with open(path, encoding="utf-8-sig") as file:
        first = next((line.strip() for line in file if line.strip()), "")
    if first.startswith("{"):
        return "mooncake"
    header = [name.strip().strip('"').lower() for name in first.split(",")]
    if all(name in header for name in _AZURE_COLUMNS):
        return "azure"
    if all(name in header for name in _BURSTGPT_COLUMNS):
        return "burstgpt"
    raise InputError(f"{path}:1: cannot tell the trace format from this line; expected an Azure "
                     "(TIMESTAMP,ContextTokens,GeneratedTokens) or BurstGPT CSV header, or Mooncake "
                     "JSONL; pass --trace-format")


def _read_csv_rows(path: Path, fmt: str, bad_rows: BadRows) -> list[tuple]:
    columns = _AZURE_COLUMNS if fmt == "azure" else _BURSTGPT_COLUMNS
    with open(path, newline="", encoding="utf-8-sig") as file:
        reader = csv.reader(file)
        header = [name.strip().lower() for name in next(reader, [])]
        missing = [name for name in columns if name not in header]
        if missing:
            raise InputError(f"{path}:1: {fmt} trace header lacks column(s) {', '.join(missing)}")
        index = [header.index(name) for name in columns]
        rows = []
        for cells in reader:
            if not any(cell.strip() for cell in cells):
                continue
            try:
                row = _csv_row(fmt, [cells[i] if i < len(cells) else "" for i in index])
            except ValueError as error:
                bad_rows.reject(path, reader.line_num, str(error))
                continue
            if row is None:
                bad_rows.empty += 1
            else:
                rows.append((reader.line_num, *row))
    return rows


def _csv_row(fmt: str, cells: list[str]) -> tuple | None:
    stamp, prompt, output = (cell.strip() for cell in cells)
    if fmt == "azure":
        try:
            time = datetime.fromisoformat(stamp).timestamp()
        except ValueError:
            raise ValueError(f"TIMESTAMP {stamp!r} is not a date-time like 2023-11-16 18:17:03.98") from None
        return time, parse_int(prompt, "ContextTokens", 1), parse_int(output, "GeneratedTokens", 1)
    time = _seconds(stamp, "Timestamp")
    generated = parse_int(output, "Response tokens", 0)
    if generated == 0:
        return None
    return time, parse_int(prompt, "Request tokens", 1), generated


def _mooncake_row(data, line_number: int) -> tuple:
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    for key in ("timestamp", "input_length", "output_length"):
        if key not in data:
            raise ValueError(f"missing {key!r}")
    return (line_number, _seconds(data["timestamp"], "timestamp") / 1000.0,
            parse_int(data["input_length"], "input_length", 1), parse_int(data["output_length"], "output_length", 1))


def _seconds(value, name: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if number < 0 or number != number:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return number
