"""`specwise monitor`: scrape every server each --interval, judge the window, show, log, alert.

Per window and server: one JSON line in --log (window.to_dict() plus the baseline, the
CUSUM statistic and the events), a dashboard row, and for each alert a webhook POST of
{"kind", "url", "time", "message", "window"}. A webhook that fails is reported and the
monitor carries on.

Exit codes (also in docs/monitor.md):
  0    ran to the end (--max-windows, --duration, --once) and raised no alert
  1    an alert (drift or too busy) was raised
  2    a flag, file or setting is wrong (message on stderr)
  3    no alert, but in the last window some server could not be read (unreachable, not a
       Prometheus page, no speculative counters)
  130  interrupted (Ctrl-C)
"""

import json
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
from rich.console import Console
from rich.live import Live

from specwise.errors import InputError
from specwise.monitor.config import MonitorConfig
from specwise.monitor.dashboard import dashboard, line
from specwise.monitor.scrape import ScrapeError, scrape
from specwise.monitor.watch import Event, Observation, TargetWatch

EXIT_OK, EXIT_ALERT, EXIT_UNREADABLE = 0, 1, 3
STATE_VERSION = 1


class Monitor:
    def __init__(self, config: MonitorConfig, client: httpx.Client, console: Console,
                 clock=time.time, sleep=time.sleep):
        self.config = config
        self.client = client
        self.console = console
        self.clock = clock
        self.sleep = sleep
        baseline, break_even = config.loaded_baseline(), config.resolved_break_even()
        self.watches = [TargetWatch(url, baseline, config.baseline_windows, config.drift, break_even,
                                    config.busy_windows) for url in config.metrics_url]
        self.events: list[Event] = []
        self.alerted = False
        self.baseline_saved = False
        self.windows_done = 0
        self.log = None

    def run(self) -> int:
        with ExitStack() as stack:
            if self.config.log:
                self.log = stack.enter_context(open(self.config.log, "a", encoding="utf-8"))
            if self.config.once:
                return self._once()
            live = None
            if self.config.dashboard:
                live = stack.enter_context(Live(console=self.console, auto_refresh=False, transient=False))
            return self._loop(live)

    def _loop(self, live) -> int:
        started = self.clock()
        latest: dict = {}
        while True:
            cycle_start = self.clock()
            latest = self.cycle()
            if live is not None:
                live.update(dashboard(self.watches, latest, self.events, self.windows_done, self.config.interval),
                            refresh=True)
            if self._done(started):
                return self._exit_code(latest)
            self.sleep(max(0.0, self.config.interval - (self.clock() - cycle_start)))

    def _once(self) -> int:
        state = self._read_state()
        if state is None:
            self.cycle()                        # no earlier scrape: take one (lifetime figures), wait
            self.sleep(self.config.interval)
        latest = self.cycle()
        if self.config.state:
            self._write_state()
        return self._exit_code(latest)

    def _done(self, started: float) -> bool:
        config = self.config
        if config.max_windows is not None and self.windows_done >= config.max_windows:
            return True
        return config.duration is not None and self.clock() - started >= config.duration

    def cycle(self) -> dict:
        """Scrape every server once; returns {url: its new window (None after a first scrape)}."""
        latest, counted = {}, False
        for watch in self.watches:
            try:
                result = scrape(self.client, watch.url, self.config.timeout, self.clock)
            except ScrapeError as error:
                result = error
            observation = watch.observe(result, self.clock())
            latest[watch.url] = observation.window
            counted |= observation.window is not None
            self._record(watch, observation)
        self.windows_done += counted
        return latest

    def _record(self, watch: TargetWatch, observation: Observation) -> None:
        window = observation.window
        if not self.config.dashboard or self.config.once:
            self.console.print(line(watch, window, self.config.interval), markup=False, highlight=False, soft_wrap=True)
        for event in observation.events:
            self.events.append(event)
            self.alerted |= event.is_alert
            self.console.print(f"{event.kind.upper()}: {event.url}: {event.message}", markup=False,
                               soft_wrap=True, style="bold red" if event.is_alert else "green")
            if event.is_alert and self.config.webhook:
                self._post(event, window)
        if window is not None and self.log is not None:
            record = {**window.to_dict(), "baseline_rate": watch.baseline.acceptance_rate if watch.baseline else None,
                      "cusum": watch.detector.statistic if watch.detector else None,
                      "events": [{"kind": e.kind, "message": e.message} for e in observation.events]}
            self.log.write(json.dumps(record) + "\n")
            self.log.flush()
        if self.config.save_baseline and watch.baseline and not self.baseline_saved and not self.config.baseline:
            watch.baseline.save(self.config.save_baseline)
            self.baseline_saved = True
            self.console.print(f"baseline saved to {self.config.save_baseline}: acceptance "
                               f"{watch.baseline.acceptance_rate:.3f} over {watch.baseline.windows} windows")

    def _post(self, event: Event, window) -> None:
        payload = {"kind": event.kind, "url": event.url, "time": event.time, "message": event.message,
                   "window": window.to_dict() if window is not None else None}
        try:
            response = self.client.post(self.config.webhook, json=payload, timeout=self.config.timeout)
            if response.status_code >= 400:
                self.console.print(f"webhook {self.config.webhook}: HTTP {response.status_code}", style="yellow")
        except httpx.HTTPError as error:
            self.console.print(f"webhook {self.config.webhook}: not delivered ({error})", style="yellow")

    def _exit_code(self, latest: dict) -> int:
        if self.alerted:
            return EXIT_ALERT
        failed = any(window is not None and window.error for window in latest.values())
        return EXIT_UNREADABLE if failed else EXIT_OK

    def _read_state(self) -> dict | None:
        if not self.config.state or not Path(self.config.state).exists():
            return None
        try:
            data = json.loads(Path(self.config.state).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            raise InputError(f"{self.config.state}: not a monitor state file; delete it to start afresh") from None
        targets = data.get("targets", {}) if isinstance(data, dict) else {}
        for watch in self.watches:
            if watch.url in targets:
                watch.restore(targets[watch.url])
        return data if any(watch.last for watch in self.watches) else None

    def _write_state(self) -> None:
        data = {"version": STATE_VERSION, "targets": {watch.url: watch.state() for watch in self.watches}}
        path = Path(self.config.state)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps(data), encoding="utf-8")
        temporary.replace(path)


def run_monitor(config: MonitorConfig, console: Console | None = None, clock=time.time, sleep=time.sleep,
                transport: httpx.BaseTransport | None = None) -> int:
    with httpx.Client(transport=transport) as client:
        return Monitor(config, client, console or Console(), clock, sleep).run()
