"""Prometheus alerting rules equivalent to the monitor's alerts, for Alertmanager users.

PromQL cannot keep a CUSUM, but it can test the condition a CUSUM reaches on a sustained
drop: after N windows of a drop of d sigmas, S = N (d - k), which crosses h when
d > k + h / N. So the drift rule averages the acceptance rate over N windows (N = 4 by
default: rate() over 4 x the window) and fires when it sits below
    mu0 - (k + h / N) sigma
(sigma as the monitor uses it: the baseline spread, inflated and floored, see drift.py).
It fires on the same sustained drops as the monitor, a little later on large ones (it
waits for N windows), and forgets a drop shorter than N windows that the CUSUM would
still accumulate.

Worked example: baseline 0.60, sigma 0.03, k = 0.5, h = 8, N = 4, 60 s windows:
threshold 0.60 - (0.5 + 2) x 0.03 = 0.525, over rate(...[4m]).

The busy rule: requests in flight (running + waiting) above the break-even at every
point of `busy_windows` windows (min_over_time over a subquery).
"""

from specwise.monitor.drift import Baseline, CusumDetector, DriftSettings

RULE_WINDOWS = 4


def alert_rules(server: str, baseline: Baseline | None, drift: DriftSettings, window_s: float,
                break_even: float | None = None, busy_windows: int = 3) -> str:
    """The rules file as YAML text (one group; a rule per alert the inputs allow)."""
    rules = []
    if baseline is not None:
        sigma = CusumDetector(baseline, drift).sigma
        threshold = baseline.acceptance_rate - (drift.k + drift.h / RULE_WINDOWS) * sigma
        span = _duration(window_s * RULE_WINDOWS)
        rules.append(_rule(
            "SpeculativeAcceptanceDrop", f"{_acceptance_expr(server, span)} < {threshold:.4f}", _duration(window_s),
            f"Speculative decoding acceptance fell below {threshold:.3f}",
            f"Acceptance rate over {span} is {{{{ $value | printf \"%.3f\" }}}}, baseline "
            f"{baseline.acceptance_rate:.3f} (sigma {sigma:.3f}); the drafter may no longer pay "
            f"(specwise monitor CUSUM k={drift.k:g}, h={drift.h:g}, over {RULE_WINDOWS} windows)."))
    if break_even is not None:
        span = _duration(window_s * busy_windows)
        in_flight = f"sum({server}:num_requests_running) + sum({server}:num_requests_waiting)"
        rules.append(_rule(
            "SpeculationTooBusyToPay", f"min_over_time(({in_flight})[{span}:]) > {break_even:g}", "0s",
            f"Concurrency above the speculative decoding break-even ({break_even:g})",
            f"Requests in flight stayed above {break_even:g} for {span}; at this load speculation "
            f"costs more than it returns (break-even from specwise evaluate / calc)."))
    lines = ["groups:", "  - name: specwise-speculative-decoding", "    rules:"]
    if not rules:
        lines[-1] += " []"
    for rule in rules:
        lines += rule
    return "\n".join(lines) + "\n"


def _acceptance_expr(server: str, span: str) -> str:
    if server == "sglang":
        return f"avg(avg_over_time(sglang:spec_accept_rate[{span}]))"
    return (f"sum(rate({server}:spec_decode_num_accepted_tokens_total[{span}])) / "
            f"sum(rate({server}:spec_decode_num_draft_tokens_total[{span}]))")


def _rule(name: str, expr: str, for_: str, summary: str, description: str) -> list[str]:
    return [f"      - alert: {name}",
            f"        expr: {_quote(expr)}",
            f"        for: {for_}",
            "        labels:",
            "          severity: warning",
            "        annotations:",
            f"          summary: {_quote(summary)}",
            f"          description: {_quote(description)}"]


def _quote(text: str) -> str:
    """A YAML single-quoted scalar (quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"


def _duration(seconds: float) -> str:
    """Prometheus duration: whole minutes when they fit, else seconds."""
    seconds = max(1, round(seconds))
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"
