"""Rounds: how a load point's requests are split, and in which arm order each round runs.

A load point's requests (the same list for every arm, bench/load/order.py) are cut into
rounds of `round_size` consecutive requests. In round r every arm serves the round's
requests, one arm after the other; then round r + 1 starts.

  interleaved  arm order alternates, forward in even rounds, reversed in odd ones:
               two arms A, B run A B | B A | A B | B A ...; three run A B C | C B A ...
               A drift in the machine's speed that is linear in time then lands on every
               arm equally over each pair of rounds (A's mean time = B's mean time), and
               the paired comparison cancels it.
  sequential   one round holding every request: each arm serves the whole point, one
               after the other (A then B). Cheapest, but a drift is read as a difference.
  blocks       launched servers one at a time (bench/launch/pool.py): the interleaved order
               with `blocks` rounds per point, the requests split evenly, each change of arm a
               restart: A | B B | A A | B. Intervals resample whole blocks (bench/stats/paired.py).

Settle: seconds of pause before a round (or warm-up) whose arm is not the previous one's
(default: LOCAL_SETTLE when an endpoint is on a loopback address, else none), so servers
sharing the machine each run on a quiet one. vLLM for CPU keeps a core busy for ~1 s after
its last request; a server measured right after it saw its first time to first token take
~1 s instead of ~0.1-0.3 s (benchmarks/README.md).

Round size for a concurrency point c: max(2c, 4) requests (a round reaches steady state
at c in flight before it drains); for open-loop points (rate, trace): 24 requests, sent
at their own offsets re-based to the round's first. Worked example: concurrency 2, 12
requests -> rounds [0:4], [4:8], [8:12], arm orders AB, BA, AB.
"""

import math
from dataclasses import dataclass
from urllib.parse import urlsplit

from specwise.bench.load.arrivals import LoadPoint

SCHEDULES = ("auto", "interleaved", "sequential")    # what --schedule accepts; "blocks" comes with --engine
OPEN_LOOP_ROUND = 24
LOCAL_SETTLE = 2.0              # seconds: the default settle when an endpoint shares this machine


@dataclass(frozen=True)
class Schedule:
    kind: str                       # "interleaved" or "sequential"
    round_size: int | None = None   # None: the default for each load point
    settle: float = 0.0             # seconds of pause when the arm changes
    blocks: int = 0                 # "blocks": rounds per load point

    def size(self, point: LoadPoint, total: int) -> int:
        """Requests per round at `point`, of `total` planned."""
        if self.kind == "sequential":
            return max(total, 1)
        if self.kind == "blocks":
            return self.round_size or max(math.ceil(total / self.blocks), 1)
        if self.round_size:
            return self.round_size
        return max(2 * int(point.value), 4) if point.kind == "concurrency" else OPEN_LOOP_ROUND

    def arm_order(self, round_index: int, arms: list) -> list:
        """Arms in the order they serve round `round_index`: A B, then B A, ..."""
        return list(arms) if self.kind == "sequential" or round_index % 2 == 0 else list(reversed(arms))

    def describe(self, arm_names: list[str]) -> str:
        pause = f", {self.settle:g} s pause when the arm changes" if self.settle else ""
        if self.kind == "sequential":
            return f"sequential: each arm serves the whole load point in turn ({' then '.join(arm_names)}){pause}"
        forward, backward = " ".join(arm_names), " ".join(reversed(arm_names))
        if self.kind == "blocks":
            size = f"{self.round_size} requests" if self.round_size else f"{self.blocks} per load point"
            return (f"in blocks of {size}, one server at a time, restarted and warmed up at each change of arm: "
                    f"{forward} | {backward} | {forward} ...")
        size = f"{self.round_size} requests" if self.round_size else "max(2 x concurrency, 4) requests (24 open-loop)"
        return f"interleaved rounds of {size}: {forward} | {backward} | {forward} ...{pause}"

    def to_dict(self, arm_names: list[str]) -> dict:
        return {"kind": self.kind, "round_size": self.round_size, "settle": self.settle, "blocks": self.blocks,
                "text": self.describe(arm_names)}


def choose_schedule(requested: str, specs, round_size: int | None = None, settle: float | None = None,
                    blocks: int | None = None) -> Schedule:
    """`auto`: interleaved unless switching an arm is costly (a draft model reloads its weights
    on every switch of the in-process engine); endpoints switch for free. settle None: LOCAL_SETTLE
    when there are several arms and an endpoint or a launched server is on this machine, else 0.
    `blocks`: launched servers paired in blocks (one up at a time; nothing to settle)."""
    if blocks:
        return Schedule("blocks", round_size, 0.0, blocks)
    if requested == "auto":
        costly = any(spec.url is None and spec.engine is None and spec.method == "draft" for spec in specs)
        requested = "sequential" if costly and len(specs) > 1 else "interleaved"
    if settle is None:
        local = any(spec.engine is not None or (spec.url is not None and is_loopback(spec.url)) for spec in specs)
        settle = LOCAL_SETTLE if local and len(specs) > 1 else 0.0
    return Schedule(requested, round_size, settle)


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host == "localhost" or host.startswith("127.") or host in ("::1", "0.0.0.0")


def rounds(count: int, size: int) -> list[tuple[int, int]]:
    """[(start, end)] slices of `count` requests: rounds(10, 4) -> [(0, 4), (4, 8), (8, 10)]."""
    return [(start, min(start + size, count)) for start in range(0, count, size)]
