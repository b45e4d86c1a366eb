"""Bad-row policy shared by the workload and trace readers.

A malformed row is an InputError naming the file and line, unless the user asked to
skip bad rows; then it is counted (and the first few reasons kept) so the run can say
how much of the input it left out.
"""

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypeVar

from specwise.errors import InputError

log = logging.getLogger(__name__)
Row = TypeVar("Row")


@dataclass
class BadRows:
    skip: bool = False
    count: int = 0
    empty: int = 0                # rows with nothing to replay (e.g. 0 generated tokens)
    examples: list[str] = field(default_factory=list)

    def reject(self, path: Path, line: int, problem: str) -> None:
        """Raise for a bad row, or count it when skipping."""
        message = f"{path}:{line}: {problem}"
        if not self.skip:
            raise InputError(message + " (use --skip-bad-rows to skip such rows)")
        self.count += 1
        if len(self.examples) < 5:
            self.examples.append(message)

    def warn_if_any(self, path: Path) -> None:
        if self.count:
            log.warning("%s: skipped %d bad row(s), first: %s", path, self.count, self.examples[0])
        if self.empty:
            log.warning("%s: dropped %d row(s) with 0 generated tokens", path, self.empty)


def parse_int(value, name: str, minimum: int) -> int:
    """Parse a count such as a token count; raises ValueError with a short reason."""
    if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        number = int(value) if isinstance(value, (int, float)) else int(str(value).strip())
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    return number


def read_jsonl(path: Path, bad_rows: BadRows, parse: Callable[[object, int], Row]) -> list[Row]:
    """parse(data, line_number) for every non-empty line of a JSON-lines file; a line that is
    not JSON, or that parse rejects with a ValueError, goes to bad_rows."""
    rows = []
    with open(path, encoding="utf-8") as file:
        for line_number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                rows.append(parse(json.loads(line), line_number))
            except json.JSONDecodeError:
                bad_rows.reject(path, line_number, "not valid JSON")
            except ValueError as error:
                bad_rows.reject(path, line_number, str(error))
    return rows
