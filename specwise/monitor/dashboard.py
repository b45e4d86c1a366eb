"""What the monitor shows: a rich table, one row per server, redrawn each window; and the
one-line form used without a terminal (--no-dashboard, --once)."""

import time

from rich.table import Table
from rich.text import Text

from specwise.monitor.watch import Event, TargetWatch
from specwise.monitor.window import Window, since_start


def dashboard(watches: list[TargetWatch], windows: dict[str, Window | None], events: list[Event],
              window_number: int, interval: float | None = None) -> Table:
    """After a first scrape (window None) a row shows the server's lifetime figures, so said in its status."""
    table = Table(title=f"specwise monitor: window {window_number}", title_justify="left")
    for column in ("server", "status", "acceptance (baseline)", "mean length", "per position", "drafts/step",
                   "concurrency", "output tok/s", "CUSUM"):
        table.add_column(column, justify="left" if column in ("server", "status") else "right")
    for watch in watches:
        window = windows.get(watch.url)
        if window is None and watch.last is not None:
            status = Text(f"{_lifetime_label(watch)}; first window {_after(interval)}", style="dim")
            table.add_row(f"{watch.url}\n{watch.server or '?'}", status,
                          *_figures(watch, since_start(watch.url, watch.last)))
            continue
        table.add_row(f"{watch.url}\n{watch.server or '?'}", _status(watch, window), *_figures(watch, window))
    if events:
        table.caption = "\n".join(f"{_when(event.time)} {event.kind}: {event.url}: {event.message}"
                                  for event in events[-5:])
        table.caption_justify = "left"
    return table


def line(watch: TargetWatch, window: Window | None, interval: float | None = None) -> str:
    """One window as a line of text; after a first scrape (window None), the server's lifetime
    figures and a line saying when the first window's follow."""
    if window is None:
        return first_scrape_lines(watch, interval)
    if window.error:
        return f"scrape failed: {window.error}"
    figures = dict(zip(("acceptance", "mean length", "per position", "drafts/step", "concurrency",
                        "output tok/s", "CUSUM"), _figures(watch, window)))
    text = ", ".join(f"{name} {value}" for name, value in figures.items() if value != "-")
    notes = f" [{'; '.join(window.notes)}]" if window.notes else ""
    return f"{watch.url} ({window.server}, {window.seconds:.0f} s): {text or 'no figures'}{notes}"


def first_scrape_lines(watch: TargetWatch, interval: float | None) -> str:
    """e.g. "URL (vllm, since the server started): acceptance 0.593, mean length 3.37, ..., drafts 2583
    (10332 draft tokens, 6125 accepted), output tokens 12379" and "URL: the first window's figures
    follow in 60 s, at the next scrape"."""
    lifetime = since_start(watch.url, watch.last)
    figures = dict(zip(("acceptance", "mean length", "per position", "drafts/step", "concurrency"),
                       _figures(watch, lifetime)))
    parts = [f"{name} {value}" for name, value in figures.items() if value != "-"]
    stats = lifetime.stats
    if stats is not None:
        parts.append(f"drafts {stats.drafts} ({stats.draft_tokens} draft tokens, {stats.accepted_tokens} accepted)")
    if lifetime.generation_tokens is not None:
        parts.append(f"output tokens {lifetime.generation_tokens:.0f}")
    notes = f" [{'; '.join(lifetime.notes)}]" if lifetime.notes else ""
    return (f"{watch.url} ({watch.last.server}, {_lifetime_label(watch)}): {', '.join(parts) or 'no figures'}"
            f"{notes}\n{watch.url}: the first window's figures follow {_after(interval)}")


def _lifetime_label(watch: TargetWatch) -> str:
    return "since the server started" if watch.last.has_counters else "the server's own recent averages"


def _after(interval: float | None) -> str:
    return f"in {interval:g} s, at the next scrape" if interval else "at the next scrape"


def _status(watch: TargetWatch, window: Window | None) -> Text:
    if window is None:
        return Text("waiting for a second scrape", style="dim")
    if window.error:
        return Text(f"scrape failed: {window.error}", style="red")
    alarms = [name for name, on in (("DRIFT", watch.detector and watch.detector.alarmed),
                                    ("TOO BUSY", watch.busy and watch.busy.alarmed)) if on]
    if alarms:
        return Text(" + ".join(alarms), style="bold red")
    if window.reset:
        return Text("counter reset", style="yellow")
    if watch.detector is None:
        return Text(f"baseline {len(watch.baseline_rates)}/{watch.baseline_windows}", style="cyan")
    return Text("ok", style="green")


def _figures(watch: TargetWatch, window: Window | None) -> list[str]:
    if window is None or window.error:
        return ["-"] * 7
    baseline = watch.baseline
    rate = _number(window.acceptance_rate, ".3f")
    if baseline is not None and rate != "-":
        rate += f" ({baseline.acceptance_rate:.3f})"
    positions = window.per_position_acceptance
    concurrency = None if window.running is None else window.running + (window.waiting or 0.0)
    busy = f" (>{watch.busy.break_even:g})" if watch.busy and concurrency and concurrency > watch.busy.break_even \
        else ""
    cusum = f"{watch.detector.statistic:.1f}/{watch.detector.settings.h:g}" if watch.detector else "-"
    return [rate, _number(window.mean_acceptance_length, ".2f"),
            " ".join(f"{p:.2f}" for p in positions) if positions else "-",
            _number(window.drafts_per_step, ".2f"), _number(concurrency, "g") + (busy if concurrency else ""),
            _number(window.output_tokens_per_s, ",.1f"), cusum]


def _number(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _when(timestamp: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(timestamp))
