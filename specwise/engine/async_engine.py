"""The engine seam for asyncio callers (server, evaluator): one thread drives `step()`.

Each request gets its own asyncio queue; a step's outputs are handed to the caller's event
loop together, in one callback, as the step produces them. A caller that stops listening (client disconnect, task
cancelled) aborts its request, which frees its KV blocks at once.

Callers never wait for a step: a prompt is tokenized and checked in a worker thread, then
("add", ...) and ("abort", ...) go into one inbox that the step thread empties, in order,
before every step. So requests sent together join the same step, however long the step
running when they arrive (waiting on the engine lock instead starved them: the step thread
takes it back at once, and a 64-request wave trickled in over several prefills).

Every torch call runs on the step thread: the engine is built there (from the `build` callable)
and `call(fn)` runs other work there between steps. libgomp gives each thread that starts
parallel work its own pool of worker threads, and once the pools hold more threads than there
are cores, their workers stop spinning between parallel regions. A model loaded on the main
thread and stepped on this one made decode steps 1.5x slower on two cores (53-66 ms against
36-40 ms at batch 1, default model, bf16).

Failures: a request the step fails (finish reason "error", fault_isolation.py) ends its stream with
RuntimeError naming the reason; the others carry on. The engine is **dead** when its step raises
(a fault it could not attribute: EngineDead), the step thread ends, or, with a watchdog, one turn
of the step thread (its inbox, then a step) runs longer than `watchdog_s`: every stream in flight
ends with EngineDead at once, new requests are refused with it, and the `on_dead` callbacks run
(the server exits so that a supervisor restarts it).
"""

import asyncio
import collections
import logging
import threading
import time
import uuid
from concurrent.futures import Future
from typing import AsyncIterator, Callable, TypeVar

from specwise.engine.fault_isolation import EngineDead, describe
from specwise.engine.llm_engine import LLMEngine, Prompt
from specwise.engine.outputs import RequestOutput
from specwise.errors import InputError
from specwise.sampling_params import SamplingParams

T = TypeVar("T")

log = logging.getLogger("specwise.engine")


class AsyncEngine:
    def __init__(self, build: Callable[[], LLMEngine]):
        """build() makes the engine, on the step thread; what it raises is raised here."""
        self.lock = threading.Lock()           # LLMEngine is not thread-safe
        self.queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self.work = threading.Event()
        self.stopping = False
        self.dead: str | None = None           # why the engine cannot go on; None while it can
        self.on_dead: list[Callable[[str], None]] = []    # called once, from whichever thread found it dead
        self.busy_since: float | None = None      # time.monotonic() at which the step thread's current turn began
        # ("add", id, token_ids, params, tenant) | ("abort", id) | ("call", fn, future)
        self.inbox: collections.deque[tuple] = collections.deque()
        self.inbox_lock = threading.Lock()     # held only to append, or to close the inbox at shutdown
        built: Future = Future()
        self.thread = threading.Thread(target=self._run, args=(build, built), name="specwise-engine", daemon=True)
        self.thread.start()
        self.engine: LLMEngine = built.result()

    async def generate(self, prompt: Prompt, params: SamplingParams, request_id: str | None = None,
                       tenant: str | None = None) -> AsyncIterator[RequestOutput]:
        request_id = request_id or uuid.uuid4().hex
        # tokenizing a long prompt or a chat template takes a while: not on the event loop
        token_ids = await asyncio.to_thread(self.engine.prepare, prompt)
        queue: asyncio.Queue = asyncio.Queue()
        with self.inbox_lock:
            self._check_open()
            if request_id in self.queues:
                raise InputError(f"request id {request_id!r} is already in flight")
            self.queues[request_id] = (asyncio.get_running_loop(), queue)
            self.inbox.append(("add", request_id, token_ids, params, tenant))
        self.work.set()
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            self.queues.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Never blocks: the step thread aborts it before its next step (after its add, if queued)."""
        self.inbox.append(("abort", request_id))
        self.work.set()

    def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """fn(engine), run on the step thread between two steps; blocks until it has run (call it from any
        thread but the step thread) and returns its result or raises its exception."""
        done: Future = Future()
        with self.inbox_lock:
            self._check_open()
            self.inbox.append(("call", fn, done))
        self.work.set()
        return done.result()

    def _check_open(self) -> None:
        if self.dead is not None:
            raise EngineDead(f"the engine is dead: {self.dead}")
        if self.stopping:
            raise RuntimeError("the engine is shut down")

    @property
    def num_in_flight(self) -> int:
        return len(self.queues)

    def start_watchdog(self, watchdog_s: float) -> None:
        """Declare the engine dead when one turn of the step thread (the inbox, then a step) runs longer than
        watchdog_s (checked 4 times a period)."""
        def watch():
            while self.dead is None and not self.stopping:
                time.sleep(watchdog_s / 4)
                self.check_progress(watchdog_s)
        threading.Thread(target=watch, name="specwise-watchdog", daemon=True).start()

    def check_progress(self, watchdog_s: float, now: float | None = None) -> None:
        """Dead if the step thread's current turn began more than watchdog_s ago, or the step thread has ended."""
        now = time.monotonic() if now is None else now
        started = self.busy_since
        if started is not None and now - started > watchdog_s:
            self.die(f"one engine step has run for more than {watchdog_s:g} s (the watchdog's limit)")
        elif not self.thread.is_alive() and not self.stopping:
            self.die("the engine's step thread has ended")

    def _run(self, build: Callable[[], LLMEngine], built: Future) -> None:
        try:
            self.engine = build()
        except BaseException as error:
            built.set_exception(error)
            return
        built.set_result(self.engine)
        try:
            self._loop()
        except BaseException as error:         # the step thread is the engine: without it nothing is served
            self.die(f"the engine's step thread raised {describe(error)}")
            raise

    def _loop(self) -> None:
        while not self.stopping and self.dead is None:
            with self.lock:
                self.busy_since = time.monotonic()
                self._take_inbox()
                busy = self.engine.has_unfinished()
                outputs = self._step() if busy else []
                self.busy_since = None
            self._deliver_all([(output.request_id, RuntimeError(f"the engine failed this request: {output.error}")
                                if output.finish_reason == "error" else output) for output in outputs])
            if not busy:
                # a request added after the check above has set the event: wait() returns at once
                self.work.wait()
                self.work.clear()

    def _take_inbox(self) -> None:
        while self.inbox:
            item = self.inbox.popleft()
            if item[0] == "abort":
                self.engine.abort(item[1])
                continue
            if item[0] == "call":
                _, fn, done = item
                try:
                    done.set_result(fn(self.engine))
                except Exception as error:
                    done.set_exception(error)
                continue
            _, request_id, token_ids, params, tenant = item
            try:
                self.engine.add_prepared(token_ids, params, request_id, tenant)
            except InputError as error:
                self._deliver(request_id, error)

    def _step(self) -> list[RequestOutput]:
        try:
            return self.engine.step()
        except Exception as error:          # no request to blame (fault_isolation.py): the engine is dead
            self.die(describe(error) if not isinstance(error, EngineDead) else str(error))
            return []

    def _deliver_all(self, items: list[tuple[str, object]]) -> None:
        """A step's outputs, handed to each caller's event loop in one callback: one wake-up of the loop per
        step, not one per request (each wake-up is a write to the loop's self-pipe, and both threads then
        wait for the GIL again: at batch 64 that was 64 round trips a step)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, object]]] = {}
        for request_id, item in items:
            entry = self.queues.get(request_id)
            if entry is not None:
                by_loop.setdefault(entry[0], []).append((entry[1], item))
        for loop, deliveries in by_loop.items():
            loop.call_soon_threadsafe(_put_all, deliveries)

    def _deliver(self, request_id: str, item) -> None:
        entry = self.queues.get(request_id)
        if entry is not None:
            loop, queue = entry
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def die(self, reason: str) -> None:
        """Mark the engine dead: end every stream in flight and refuse new requests at once, without the engine
        lock (a hung step holds it), then run the on_dead callbacks. Only the first call does anything."""
        with self.inbox_lock:
            if self.dead is not None:
                return
            self.dead = reason
        log.error("the engine is dead: %s", reason)
        error = EngineDead(f"the engine is dead: {reason}")
        while self.inbox:
            item = self.inbox.popleft()
            if item[0] == "call":
                item[2].set_exception(error)
        for request_id in list(self.queues):
            self._deliver(request_id, error)
        self.work.set()
        for callback in self.on_dead:
            callback(reason)

    def shutdown(self) -> None:
        """Abort whatever is in flight and stop the step thread (a dead engine's may hang: not waited for)."""
        with self.inbox_lock:
            self.stopping = True
        if self.dead is not None:
            self.work.set()
            self.thread.join(timeout=1)
            return
        with self.lock:
            while self.inbox:
                item = self.inbox.popleft()
                if item[0] == "add":
                    self._deliver(item[1], RuntimeError("the engine is shut down"))
                elif item[0] == "call":
                    item[2].set_exception(RuntimeError("the engine is shut down"))
            for request_id in list(self.engine.requests):
                self.engine.abort(request_id)
            for output in self.engine.step():   # the "abort" outputs end the streams still listening
                self._deliver(output.request_id, output)
        self.work.set()
        self.thread.join(timeout=10)


def _put_all(deliveries: list[tuple[asyncio.Queue, object]]) -> None:
    for queue, item in deliveries:
        queue.put_nowait(item)
