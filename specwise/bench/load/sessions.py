"""Multi-turn session replay: a session's next turn is sent after the previous answer, carrying it.

Terms:
  - **session**: requests sharing `extra["session"]`, numbered by `extra["turn"]` (0, 1, ...).
    Each line holds the whole conversation up to its own user message, with a *reference*
    answer for every earlier turn (the built-in `agentic` category, or a user JSONL with
    "session" and "turn" keys), so a turn also stands on its own (e.g. for `simulate`).
  - **replay**: per arm and load point, turn n waits until turn n-1 of the same session has
    finished on that arm, then is sent as turn n-1's sent messages + {"role": "assistant",
    "content": <the answer the arm produced>} + turn n's messages after its last assistant
    message. Waiting happens before `measure`, so it is not counted in the request's TTFT or
    e2e latency (a closed-loop worker waits, as an agent does).
  - A turn whose previous turn never started on that arm (cut off by --duration, warm-up) or
    failed is sent as written, with the reference answers. Repeats of the workload (`#2` ids)
    are sessions of their own.

The order keeps a session's turns in turn order (bench/load/order.py), and workers take
requests in that order, so a waiting turn's predecessor is always already in flight.

Worked example: turn 0 [system, user "top 10 customers?"] returns "SELECT ... LIMIT 10;".
Turn 1 on file [system, user, assistant <reference>, user "only 2024"] is sent as
[system, user "top 10 customers?", assistant "SELECT ... LIMIT 10;", user "only 2024"].
"""

import asyncio
import dataclasses
from dataclasses import dataclass, field

from specwise.bench.inputs.request import WorkloadRequest
from specwise.bench.load.targets.base import TokenChunk


@dataclass
class _Session:
    done: dict[int, asyncio.Event] = field(default_factory=dict)    # turn -> set when it ends; claimed at once
    history: dict[int, list[dict]] = field(default_factory=dict)    # turn -> sent messages + its answer


def session_key(request: WorkloadRequest) -> str | None:
    """`session#repeat` for a session turn, else None."""
    session, turn = request.extra.get("session"), request.extra.get("turn")
    if not isinstance(session, str) or not isinstance(turn, int) or isinstance(turn, bool) or not request.messages:
        return None
    _, _, repeat = request.request_id.partition("#")
    return f"{session}#{repeat}"


class Sessions:
    """Session state of a run, by (arm, load point, session)."""

    def __init__(self):
        self.sessions: dict[tuple, _Session] = {}

    async def prepare(self, arm: str, point, request: WorkloadRequest) -> WorkloadRequest:
        """Wait for the previous turn (if in flight on this arm) and carry its answer; marks this turn started."""
        key = session_key(request)
        if key is None:
            return request
        turn = request.extra["turn"]
        state = self.sessions.setdefault((arm, point, key), _Session())
        state.done[turn] = asyncio.Event()          # claimed before any wait: the next turn waits for it
        previous = state.done.get(turn - 1)
        if previous is not None:
            await previous.wait()
        messages = request.messages
        if turn - 1 in state.history:
            messages = state.history.pop(turn - 1) + _own_messages(request.messages)
        return dataclasses.replace(request, messages=messages)

    def finish(self, arm: str, point, request: WorkloadRequest, answer: str | None) -> None:
        """Record the answer of a turn sent after `prepare` (None when it failed)."""
        key = session_key(request)
        if key is None:
            return
        state, turn = self.sessions[(arm, point, key)], request.extra["turn"]
        if answer is not None:
            state.history[turn] = request.messages + [{"role": "assistant", "content": answer}]
        state.done[turn].set()

    def recorder(self, target) -> "AnswerRecorder":
        return AnswerRecorder(target)


class AnswerRecorder:
    """A target that keeps the text it streamed (measure() times it exactly as the target itself)."""

    def __init__(self, target):
        self.target, self.name, self.method = target, target.name, target.method
        self.text = ""

    async def stream(self, request):
        async for event in self.target.stream(request):
            if isinstance(event, TokenChunk):
                self.text += event.text
            yield event


def _own_messages(messages: list[dict]) -> list[dict]:
    """The messages after the last assistant one: what this turn adds."""
    last = max((index for index, message in enumerate(messages) if message["role"] == "assistant"), default=-1)
    return messages[last + 1:]
