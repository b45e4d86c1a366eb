"""One monitored server: scrapes in, windows and events out.

`TargetWatch.observe(snapshot or ScrapeError)` turns consecutive scrapes into a `Window`
(window.py), builds the baseline from the first windows when no baseline file was given,
then feeds each window to the drift test (drift.py) and the busy watch (busy.py). The first
good scrape only starts the first window. Failed scrapes give a window that carries the
error and nothing else; the next good scrape is differenced against the last good one.

Its whole state (last snapshot, baseline, detector) round-trips through `state()` /
`restore()`, so `specwise monitor --once --state FILE` run from cron continues where the
previous run stopped.
"""

from dataclasses import asdict, dataclass, field

from specwise.bench.load.targets.base import ServerAcceptance
from specwise.monitor.busy import BusyWatch
from specwise.monitor.drift import Baseline, CusumDetector, DriftSettings
from specwise.monitor.exposition import Snapshot
from specwise.monitor.scrape import ScrapeError
from specwise.monitor.window import Window, failed_window, window_between

DEFAULT_BASELINE_WINDOWS = 20
ALERTS = ("drift", "too_busy")           # event kinds that are alerts (the others clear them)


@dataclass(frozen=True)
class Event:
    kind: str            # "drift" | "recovered" | "too_busy" | "calm"
    url: str
    time: float
    message: str

    @property
    def is_alert(self) -> bool:
        return self.kind in ALERTS


@dataclass
class Observation:
    window: Window | None            # None for the first good scrape (it only starts a window)
    events: list[Event] = field(default_factory=list)


class TargetWatch:
    def __init__(self, url: str, baseline: Baseline | None = None, baseline_windows: int = DEFAULT_BASELINE_WINDOWS,
                 drift: DriftSettings | None = None, break_even: float | None = None, busy_windows: int = 3):
        self.url = url
        self.settings = drift or DriftSettings()
        self.baseline_windows = baseline_windows
        self.baseline_rates: list[float] = []
        self.baseline_seconds: list[float] = []
        self.detector = CusumDetector(baseline, self.settings) if baseline else None
        self.busy = BusyWatch(break_even, busy_windows) if break_even is not None else None
        self.last: Snapshot | None = None
        self.last_attempt: float | None = None
        self.server: str | None = None

    @property
    def baseline(self) -> Baseline | None:
        return self.detector.baseline if self.detector else None

    def observe(self, result: Snapshot | ScrapeError, now: float) -> Observation:
        start = self.last.time if self.last else (self.last_attempt or now)
        self.last_attempt = now
        if isinstance(result, ScrapeError):
            return Observation(failed_window(self.url, start, now, str(result)))
        before, self.last, self.server = self.last, result, result.server
        if before is None:
            return Observation(None)
        window = window_between(self.url, before, result)
        return Observation(window, self._judge(window))

    def _judge(self, window: Window) -> list[Event]:
        events = []
        drafts = window.stats.drafts if window.stats else None
        if self.detector is None:
            self._collect_baseline(window, drafts)
        else:
            drift = self.detector.update(window.acceptance_rate, drafts)
            if drift:
                events.append(Event(drift.kind, self.url, window.end, drift.message))
        if self.busy and not window.reset:
            concurrency = None if window.running is None else window.running + (window.waiting or 0.0)
            busy = self.busy.update(concurrency)
            if busy:
                events.append(Event(busy.kind, self.url, window.end, busy.message))
        return events

    def _collect_baseline(self, window: Window, drafts: int | None) -> None:
        rate = window.acceptance_rate
        if rate is None or (drafts is not None and drafts < self.settings.min_drafts):
            return
        self.baseline_rates.append(rate)
        self.baseline_seconds.append(window.seconds)
        if len(self.baseline_rates) >= self.baseline_windows:
            seconds = sum(self.baseline_seconds) / len(self.baseline_seconds)
            baseline = Baseline.from_rates(self.baseline_rates, seconds, window.server or "", self.url)
            self.detector = CusumDetector(baseline, self.settings)

    def state(self) -> dict:
        return {"last": _snapshot_to_dict(self.last) if self.last else None, "last_attempt": self.last_attempt,
                "baseline_rates": self.baseline_rates, "baseline_seconds": self.baseline_seconds,
                "baseline": asdict(self.baseline) if self.baseline else None,
                "detector": self.detector.state() if self.detector else None,
                "busy": self.busy.state() if self.busy else None}

    def restore(self, state: dict) -> None:
        self.last = _snapshot_from_dict(state["last"]) if state.get("last") else None
        self.last_attempt = state.get("last_attempt")
        self.baseline_rates = list(state.get("baseline_rates") or [])
        self.baseline_seconds = list(state.get("baseline_seconds") or [])
        if self.detector is None and state.get("baseline"):
            self.detector = CusumDetector(Baseline(**state["baseline"]), self.settings)
        if self.detector and state.get("detector"):
            self.detector.restore(state["detector"])
        if self.busy and state.get("busy"):
            self.busy.restore(state["busy"])


def _snapshot_to_dict(snapshot: Snapshot) -> dict:
    return {"server": snapshot.server, "time": snapshot.time, "acceptance": asdict(snapshot.acceptance),
            "generation_tokens": snapshot.generation_tokens, "running": snapshot.running,
            "waiting": snapshot.waiting}


def _snapshot_from_dict(data: dict) -> Snapshot:
    return Snapshot(server=data["server"], time=data["time"], acceptance=ServerAcceptance(**data["acceptance"]),
                    generation_tokens=data.get("generation_tokens"), running=data.get("running"),
                    waiting=data.get("waiting"))
