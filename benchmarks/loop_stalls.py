"""Where a server's event loop stalls: `specwise serve` with a heartbeat and a stack sampler.

    python benchmarks/loop_stalls.py [specwise serve flags]      # overload.py --diagnose runs this

A watcher thread posts a heartbeat onto the event loop every HEARTBEAT_S and, while one is
late by more than LATE_S, samples the event-loop thread's Python stack every SAMPLE_S
(sys._current_frames). At exit (and every REPORT_S) it prints to stderr how many heartbeats
were late by > 0.1 s and > 1 s, the latest one, and the innermost frames sampled most often
while the loop was late, with their counts: the code that held the loop (or waited for the GIL
there). A probe that is slow while every heartbeat is on time waited elsewhere (the listen
backlog, the client). It also times every garbage collection (gc.callbacks): a collection stops every
thread that wants the GIL, the event loop's included, and a full one walks every live Python object.
Diagnostic only: it adds a thread, so its figures are not the product's.
$LOOP_STALLS_SWITCH_INTERVAL=S sets sys.setswitchinterval(S) first (an experiment: how much of a stall
is the event loop waiting its turn for the GIL that the step thread holds between torch calls).
"""

import asyncio
import atexit
import collections
import gc
import os
import sys
import threading
import time
import traceback

import uvicorn

HEARTBEAT_S = 0.05
LATE_S = 0.1
SAMPLE_S = 0.01
REPORT_S = 30.0
FRAMES = 4            # innermost frames kept per sample


class LoopWatch:
    def __init__(self):
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread: int | None = None
        self.late = collections.Counter()            # "> 0.1 s", "> 1 s"
        self.worst = 0.0
        self.stacks: collections.Counter = collections.Counter()
        self.samples = 0
        self.gc_started: float | None = None
        self.gc_pauses: collections.defaultdict[int, list[float]] = collections.defaultdict(list)   # generation -> s

    def on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.gc_started = time.perf_counter()
        elif self.gc_started is not None:
            self.gc_pauses[info["generation"]].append(time.perf_counter() - self.gc_started)

    def attach(self, loop) -> None:
        self.loop, self.loop_thread = loop, threading.get_ident()
        threading.Thread(target=self.watch, name="loop-watch", daemon=True).start()

    def watch(self) -> None:
        last_report = time.monotonic()
        while True:
            beat = threading.Event()
            sent = time.monotonic()
            try:
                self.loop.call_soon_threadsafe(beat.set)
            except RuntimeError:           # the loop is closed
                return
            while not beat.wait(SAMPLE_S if time.monotonic() - sent > LATE_S else LATE_S):
                self.sample()
            lateness = time.monotonic() - sent
            self.worst = max(self.worst, lateness)
            if lateness > LATE_S:
                self.late["> 0.1 s"] += 1
            if lateness > 1.0:
                self.late["> 1 s"] += 1
            if time.monotonic() - last_report > REPORT_S:
                self.report()
                last_report = time.monotonic()
            time.sleep(HEARTBEAT_S)

    def sample(self) -> None:
        frame = sys._current_frames().get(self.loop_thread)
        if frame is None:
            return
        stack = traceback.extract_stack(frame)[-FRAMES:]
        self.samples += 1
        self.stacks[" <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in reversed(stack))] += 1

    def report(self) -> None:
        lines = [f"loop-watch: heartbeats late > 0.1 s: {self.late['> 0.1 s']}, > 1 s: {self.late['> 1 s']}, "
                 f"worst {self.worst:.3f} s, {self.samples} stack samples while late"]
        lines += [f"loop-watch:   {count:5d}  {stack}" for stack, count in self.stacks.most_common(12)]
        for generation, pauses in sorted(self.gc_pauses.items()):
            lines.append(f"loop-watch: gc generation {generation}: {len(pauses)} collections, total "
                         f"{sum(pauses):.3f} s, worst {max(pauses) * 1000:.1f} ms, "
                         f"{sum(p > 0.1 for p in pauses)} over 100 ms")
        print("\n".join(lines), file=sys.stderr, flush=True)


WATCH = LoopWatch()
_serve = uvicorn.Server.serve


async def serve(self, *args, **kwargs):
    """uvicorn.Server.serve, watched: the running loop is found here whichever loop uvicorn chose (asyncio, uvloop)."""
    if WATCH.loop is None:
        WATCH.attach(asyncio.get_running_loop())
    return await _serve(self, *args, **kwargs)


if __name__ == "__main__":
    if os.environ.get("LOOP_STALLS_SWITCH_INTERVAL"):
        sys.setswitchinterval(float(os.environ["LOOP_STALLS_SWITCH_INTERVAL"]))
    uvicorn.Server.serve = serve
    gc.callbacks.append(WATCH.on_gc)
    atexit.register(WATCH.report)
    from specwise.cli import main
    sys.exit(main(["serve", *sys.argv[1:]]))
