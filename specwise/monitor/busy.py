""""Too busy to pay": concurrency sits above the break-even where speculation stops paying.

The break-even is a concurrency (requests in flight) that `specwise evaluate` measured (the
crossover of an arm's latency speedup through 1.0, in summary.json under
recommendation.verdicts[].crossover, see bench/report/recommend.py) or that the user gives
(`--break-even N`, e.g. from `specwise calc throughput`).

A window's concurrency is running + waiting requests at its end (as `evaluate` counts
concurrency: every request in flight, queued or not). After `windows` (3) windows in a row
above the break-even, one "too_busy" alert; a window at or below it clears the episode
("calm" event), so a later busy stretch alerts again.

Worked example: break-even 10.1 (speedups 1.4 at concurrency 4 and 0.8 at 16). Windows
with concurrency 12, 14, 15 -> alert at the third; 16 -> nothing new; 6 -> calm.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from specwise.errors import ConfigError, InputError

DEFAULT_BUSY_WINDOWS = 3


def break_even_from_results(path, arm: str | None = None) -> float:
    """The lowest concurrency crossover recorded in an evaluate results directory (or its
    summary.json), or that of `arm`."""
    path = Path(path)
    summary_path = path / "summary.json" if path.is_dir() else path
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except OSError:
        raise InputError(f"{summary_path}: cannot read; is {path} a results directory of `specwise evaluate` "
                         f"(run `specwise report {path}` to write its summary.json)?") from None
    except json.JSONDecodeError:
        raise InputError(f"{summary_path}: not valid JSON") from None
    verdicts = (summary.get("recommendation") or {}).get("verdicts") or []
    verdicts = [v for v in verdicts if v.get("load_kind") == "concurrency" and (arm is None or v.get("arm") == arm)]
    if arm is not None and not verdicts:
        raise ConfigError(f"{summary_path}: no concurrency verdict for arm {arm!r}")
    crossings = [(v["crossover"], v["arm"]) for v in verdicts if v.get("crossover") is not None]
    if not crossings:
        said = "; ".join(v.get("verdict", "") for v in verdicts) or "no concurrency sweep in it"
        raise ConfigError(f"{summary_path}: no break-even recorded ({said}); give --break-even N")
    return min(crossings)[0]


@dataclass(frozen=True)
class BusyEvent:
    kind: str            # "too_busy" (an alert) or "calm"
    concurrency: float
    message: str


class BusyWatch:
    def __init__(self, break_even: float, windows: int = DEFAULT_BUSY_WINDOWS):
        if break_even <= 0 or windows < 1:
            raise ConfigError(f"break-even must be > 0 and busy windows >= 1, got {break_even}, {windows}")
        self.break_even = break_even
        self.windows = windows
        self.above = 0
        self.alarmed = False

    def update(self, concurrency: float | None) -> BusyEvent | None:
        if concurrency is None:
            return None
        if concurrency <= self.break_even:
            self.above = 0
            if self.alarmed:
                self.alarmed = False
                return BusyEvent("calm", concurrency, f"concurrency {concurrency:g} back at or below the "
                                 f"break-even {self.break_even:g}")
            return None
        self.above += 1
        if self.alarmed or self.above < self.windows:
            return None
        self.alarmed = True
        return BusyEvent("too_busy", concurrency,
                         f"too busy to pay: concurrency {concurrency:g} above the break-even {self.break_even:g} "
                         f"for {self.above} windows; speculation likely costs more than it returns")

    def state(self) -> dict:
        return {"above": self.above, "alarmed": self.alarmed}

    def restore(self, state: dict) -> None:
        self.above = int(state.get("above", 0))
        self.alarmed = bool(state.get("alarmed", False))
