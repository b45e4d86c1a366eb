"""What the user sees while a run goes: rich progress bars and a live table of finished
load points on a terminal, one plain line per load point otherwise (logs, CI, tests).
"""

import sys
from typing import Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from specwise.bench.load.arrivals import LoadPoint
from specwise.bench.load.metrics import PointMetrics
from specwise.bench.results import RequestRecord

COLUMNS = ("arm", "load", "ok", "errors", "TTFT p50", "TPOT mean", "e2e p50", "out tok/s", "acceptance")


class View(Protocol):
    def arm_started(self, arm: str) -> None: ...
    def point_started(self, arm: str, point: LoadPoint, expected: int) -> None: ...
    def request_done(self, record: RequestRecord) -> None: ...
    def point_done(self, arm: str, point: LoadPoint, metrics: PointMetrics, cut_off: int = 0) -> None: ...
    def close(self) -> None: ...


def make_view(live: bool) -> View:
    return LiveView() if live and sys.stderr.isatty() else PlainView()


def point_cells(arm: str, point: LoadPoint, metrics: PointMetrics) -> list[str]:
    accepted = metrics.acceptance
    acceptance = "-" if accepted is None or accepted.rate is None else f"{accepted.rate:.0%}"
    return [arm, point.label(), str(metrics.completed), str(metrics.errors), _ms(metrics.ttft.p50),
            _ms(metrics.tpot.mean), _ms(metrics.e2e.p50),
            "-" if metrics.output_throughput is None else f"{metrics.output_throughput:.1f}", acceptance]


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


class PlainView:
    def __init__(self, stream=None):
        self.stream = stream or sys.stderr

    def arm_started(self, arm: str) -> None:
        print(f"arm {arm}", file=self.stream, flush=True)

    def point_started(self, arm: str, point: LoadPoint, expected: int) -> None:
        pass

    def request_done(self, record: RequestRecord) -> None:
        pass

    def point_done(self, arm: str, point: LoadPoint, metrics: PointMetrics, cut_off: int = 0) -> None:
        cells = point_cells(arm, point, metrics)
        text = "  ".join(f"{name}={value}" for name, value in zip(COLUMNS[1:], cells[1:]))
        errors = f"  first error: {next(iter(metrics.error_kinds))}" if metrics.error_kinds else ""
        cut = f"  cut off at the time limit: {cut_off}" if cut_off else ""
        print(f"  {text}{errors}{cut}", file=self.stream, flush=True)

    def close(self) -> None:
        pass


class LiveView:
    def __init__(self):
        self.console = Console(stderr=True)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=self.console)
        self.table = Table(*COLUMNS, title="finished load points", title_justify="left")
        self.live = Live(Group(self.progress, self.table), console=self.console, refresh_per_second=4)
        self.live.start()
        self.task = None
        self.description = ""
        self.errors = 0

    def arm_started(self, arm: str) -> None:
        self.console.log(f"arm [bold]{arm}[/bold]")

    def point_started(self, arm: str, point: LoadPoint, expected: int) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.errors = 0
        self.description = f"{arm} · {point.label()}"
        self.task = self.progress.add_task(self.description, total=expected)

    def request_done(self, record: RequestRecord) -> None:
        self.errors += bool(record.error)
        errors = f"  [red]{self.errors} error(s)[/red]" if self.errors else ""
        self.progress.update(self.task, advance=1, description=self.description + errors)

    def point_done(self, arm: str, point: LoadPoint, metrics: PointMetrics, cut_off: int = 0) -> None:
        self.table.add_row(*point_cells(arm, point, metrics))
        if metrics.error_kinds:
            self.console.log(f"[red]{arm} · {point.label()}: {metrics.errors} error(s), first: "
                             f"{next(iter(metrics.error_kinds))}[/red]")
        if cut_off:
            self.console.log(f"[yellow]{arm} · {point.label()}: {cut_off} request(s) cut off at the time limit"
                             "[/yellow]")

    def close(self) -> None:
        self.live.stop()
