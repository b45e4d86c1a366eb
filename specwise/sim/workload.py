"""What the simulator takes from a workload and a load point, the way `evaluate` does.

Prompt lengths: a request's known token count (traces), else its text length at 4
characters per token (the simulator has no tokenizer; run.json counts such estimates).
Send times: a closed loop (concurrency c) sends as earlier requests finish; a rate point
uses evaluate's Gamma-distributed gaps with the same seed; trace replay divides the
trace's arrival times by the time scale.
"""

from specwise.bench.load.arrivals import LoadPoint, gamma_arrivals, trace_arrivals
from specwise.bench.inputs.request import WorkloadRequest
from specwise.errors import ConfigError, InputError

CHARS_PER_TOKEN = 4


def prompt_tokens(request: WorkloadRequest) -> tuple[int, bool]:
    """Known prompt length, or (estimated from text at 4 characters per token, True)."""
    if request.prompt_tokens is not None:
        return request.prompt_tokens, False
    text = request.prompt or "".join(str(m.get("content", "")) for m in request.messages or [])
    return max(1, round(len(text) / CHARS_PER_TOKEN)), True


def send_times(requests: list[WorkloadRequest], load: LoadPoint, burstiness: float, seed: int) -> list[float] | None:
    """Send offsets (seconds) per request for open-loop points; None for a closed loop."""
    if load.kind == "concurrency":
        if load.value < 1:
            raise ConfigError(f"concurrency must be >= 1, got {load.value}")
        return None
    if load.kind == "rate":
        return gamma_arrivals(len(requests), load.value, burstiness, seed)
    if load.kind == "trace":
        if any(r.arrival_time is None for r in requests):
            raise InputError("trace replay needs an arrival time on every request")
        return trace_arrivals(requests, load.value)
    raise ConfigError(f"unknown load kind {load.kind!r}")
