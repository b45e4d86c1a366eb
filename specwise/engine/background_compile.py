"""Serve eagerly at once while the compiled graphs build in another process; switch over when they are ready.

`specwise serve` compiles by default, and compiling the default model's 8 graphs takes ~3 minutes on two cores
the first time on a machine (later starts load them from the compile cache in seconds). When the cache lacks
them, the engine starts eager (LLMEngine with compile=None: `pending_compile` names the graphs) and this:

  1. starts compile_worker.py in a process of its own (its own session, so its compiler runs go with it; lower
     priority), which builds the graphs into the same cache entry: compiling there keeps the GIL and the event
     loop free;
  2. when it exits 0, loads the packages on this thread (no request waits for that), then has the engine's step
     thread switch the runner's forward over between two steps (`AsyncEngine.call`), after running each graph
     once over a scratch cache;
  3. when it fails, or a graph does not load or run, keeps serving eagerly.

Meanwhile the engine's steps use one torch thread fewer (LLMEngine.thread_cap): on two cores, two OpenMP
threads that share a core with the compile wait for each other at every parallel region.

One line on stderr at each stage (the worker's own "specwise: ..." lines, one per graph, pass through).
`stop()` ends the worker by its process group id (the server calls it on every way out); a worker whose
parent dies without stopping it ends itself (compile_worker.py).
"""

import collections
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable

from specwise.engine.async_engine import AsyncEngine
from specwise.models.compile.graphs import CompiledForward, scratch_cache

WORKER = [sys.executable, "-m", "specwise.engine.compile_worker"]
STOP_GRACE_S = 5.0          # from SIGTERM to SIGKILL when stopping the worker
FAILED_PREFIX = "specwise: compile worker: "


def note(message: str) -> None:
    print(f"specwise: {message}", file=sys.stderr, flush=True)


class BackgroundCompile:
    """state: "compiling", then "compiled" (the engine switched, on_switched returned) or "failed" (`reason` says
    why), or "stopped". Each is set last, so whoever reads it sees everything that stage does."""

    def __init__(self, async_engine: AsyncEngine, worker: list[str] | None = None,
                 on_switched: Callable[[], None] | None = None):
        """on_switched: called on the watch thread once the engine serves the compiled graphs."""
        engine = async_engine.engine
        if engine.pending_compile is None:
            raise ValueError("the engine has no graphs to compile")
        self.async_engine = async_engine
        self.on_switched = on_switched
        self.graph_set = engine.pending_compile
        self.depths = tuple(engine.runner.depths)
        self.state, self.reason = "compiling", None
        self.stopping = threading.Event()
        self.lines: collections.deque[str] = collections.deque(maxlen=20)     # the worker's last stderr lines
        spec = {"config": dataclasses.asdict(engine.config), "threads": engine.num_threads,
                "depths": list(self.depths), "key": self.graph_set.key}
        # the engine's steps leave a core to the compile: two OpenMP threads on two cores shared with it stalled
        # each other (default model: eager TPOT 656 ms median while compiling, 2.7 s gaps; capped, 42.9 ms)
        engine.thread_cap = max(1, engine.num_threads - 1)
        self.started = time.monotonic()
        self.process = subprocess.Popen([*(worker or WORKER), json.dumps(spec)], stdin=subprocess.PIPE,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                        errors="replace", start_new_session=True)
        count = self.graph_set.count(self.depths)
        note(f"serving eagerly while {count} graphs compile in process {self.process.pid}; switching to them when "
             f"they are ready")
        self.thread = threading.Thread(target=self._watch, name="specwise-compile-watch", daemon=True)
        self.thread.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _watch(self) -> None:
        for line in self.process.stderr:
            line = line.rstrip("\n")
            self.lines.append(line)
            if line.startswith("specwise: ") and not line.startswith(FAILED_PREFIX):
                print(line, file=sys.stderr, flush=True)       # a line per graph
        status = self.process.wait()
        if self.stopping.is_set():
            return
        if status != 0:
            self._fail(self._why(status))
            return
        compiled_s = time.monotonic() - self.started
        try:
            forward = self._load()
            self.async_engine.call(lambda engine: engine.use_compiled(forward))
        except Exception as error:
            if not self.stopping.is_set():
                self._fail(f"the compiled graphs did not load or run: {_first_line(error)}")
            return
        note(f"switched to compiled graphs after {time.monotonic() - self.started:.0f} s "
             f"(compiled in {compiled_s:.0f} s)")
        if self.on_switched is not None:
            self.on_switched()
        self.state = "compiled"

    def _load(self) -> CompiledForward:
        """The packages loaded on this thread: nothing is run here (the step thread runs each once)."""
        runner = self.async_engine.engine.runner
        return CompiledForward(runner.model, scratch_cache(runner.kv_cache), self.graph_set, self.depths,
                               compile_missing=False, run_now=False)

    def _why(self, status: int) -> str:
        said = [line[len(FAILED_PREFIX):] for line in self.lines if line.startswith(FAILED_PREFIX)]
        if said:
            return said[-1]
        last = next((line.strip() for line in reversed(self.lines) if line.strip()), "")
        ending = f"signal {-status}" if status < 0 else f"status {status}"
        return f"the compile worker ended with {ending}" + (f": {last}" if last else "")

    def _fail(self, reason: str) -> None:
        self.async_engine.engine.thread_cap = None          # no compile left to share the cores with
        note(f"compiling failed ({reason}); serving eagerly")
        self.reason = reason
        self.state = "failed"

    def stop(self) -> None:
        """End the worker (its process group, by id) and wait for it; the engine keeps its current forward."""
        self.stopping.set()
        if self.process.poll() is None:
            if self.state == "compiling":
                self.state = "stopped"
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                _signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.thread.join(timeout=STOP_GRACE_S)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
