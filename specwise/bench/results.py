"""The results format shared by `evaluate` (measured) and `simulate` (predicted).

A results directory holds:
  run.json        what was run: {"tool": "evaluate"|"simulate", "model", "machine", "arms": [...],
                  "loads": [...], "slo": {...}, "started": iso time, "argv": [...]}
  requests.jsonl  one RequestRecord per line, appended (and flushed) as each request finishes,
                  so an interrupted run keeps everything it finished.
  summary.json / summary.md / report.html   rendered by `specwise report DIR`.

Times are seconds. `send_time` is relative to the start of the run; `ttft`, `e2e`
and `chunk_times` are relative to the request's own send time.
"""

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from specwise.errors import InputError


@dataclass
class RequestRecord:
    arm: str                      # e.g. "off", "ngram-k4", "vllm-eagle"
    method: str                   # "off", "ngram", "draft", "layer_skip", "eagle", "http", ...
    load_kind: str                # "concurrency" | "rate" | "trace"
    load_value: float             # concurrency level, requests/s, or trace time scale
    category: str                 # workload category ("code_editing", "chat", "trace", ...)
    request_id: str
    prompt_tokens: int
    output_tokens: int
    send_time: float
    ttft: float | None = None
    e2e: float | None = None
    chunk_times: list[float] = field(default_factory=list)   # arrival of each streamed chunk
    chunk_tokens: list[int] = field(default_factory=list)    # tokens carried by each chunk
    error: str | None = None
    warmup: bool = False
    drafts: int | None = None           # None: acceptance unknown for this arm
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    accepted_per_position: list[int] | None = None
    round: int | None = None            # round of the load point (arms alternate between rounds)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))


class RecordWriter:
    """Appends records to requests.jsonl, flushed and fsynced per record."""

    def __init__(self, results_dir: Path):
        self.path = Path(results_dir) / "requests.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, record: RequestRecord) -> None:
        self._file.write(record.to_json() + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_records(results_dir: Path) -> list[RequestRecord]:
    """Read requests.jsonl; a half-written last line (killed mid-write) is ignored."""
    path = Path(results_dir) / "requests.jsonl"
    if not path.exists():
        raise InputError(f"{path}: no such file; is {results_dir} a specwise results directory?")
    return read_records_file(path)


def read_records_file(path: Path) -> list[RequestRecord]:
    """Records, one JSON object a line; a half-written last line is ignored."""
    names = {f.name for f in dataclasses.fields(RequestRecord)}
    records = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise InputError(f"{path}:{number}: not valid JSON")
        records.append(RequestRecord(**{k: v for k, v in data.items() if k in names}))
    return records


def write_run_info(results_dir: Path, info: dict) -> None:
    path = Path(results_dir) / "run.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, indent=2), encoding="utf-8")


def read_run_info(results_dir: Path) -> dict:
    path = Path(results_dir) / "run.json"
    if not path.exists():
        raise InputError(f"{path}: no such file; is {results_dir} a specwise results directory?")
    return json.loads(path.read_text(encoding="utf-8"))
