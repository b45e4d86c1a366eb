"""The engine seam for asyncio callers (server, evaluator): one thread drives `step()`.

Each request gets its own asyncio queue; outputs are handed to the caller's event loop
as the step produces them. A caller that stops listening (client disconnect, task
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
"""

import asyncio
import collections
import threading
import uuid
from concurrent.futures import Future
from typing import AsyncIterator, Callable, TypeVar

from specwise.engine.llm_engine import LLMEngine, Prompt
from specwise.engine.outputs import RequestOutput
from specwise.errors import InputError
from specwise.sampling_params import SamplingParams

T = TypeVar("T")


class AsyncEngine:
    def __init__(self, build: Callable[[], LLMEngine]):
        """build() makes the engine, on the step thread; what it raises is raised here."""
        self.lock = threading.Lock()           # LLMEngine is not thread-safe
        self.queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self.work = threading.Event()
        self.stopping = False
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
            if self.stopping:
                raise RuntimeError("the engine is shut down")
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
            if self.stopping:
                raise RuntimeError("the engine is shut down")
            self.inbox.append(("call", fn, done))
        self.work.set()
        return done.result()

    @property
    def num_in_flight(self) -> int:
        return len(self.queues)

    def _run(self, build: Callable[[], LLMEngine], built: Future) -> None:
        try:
            self.engine = build()
        except BaseException as error:
            built.set_exception(error)
            return
        built.set_result(self.engine)
        while not self.stopping:
            with self.lock:
                self._take_inbox()
                busy = self.engine.has_unfinished()
                outputs = self._step() if busy else []
            for output in outputs:
                self._deliver(output.request_id, output)
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
        except Exception as error:          # a failed step fails its requests, not the server
            self._fail_all(error)
            return []

    def _deliver(self, request_id: str, item) -> None:
        entry = self.queues.get(request_id)
        if entry is not None:
            loop, queue = entry
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def _fail_all(self, error: Exception) -> None:
        for request_id in list(self.engine.requests):
            self.engine.abort(request_id)
            self._deliver(request_id, RuntimeError(f"engine step failed: {error}"))
        self.engine.step()   # drain the abort outputs

    def shutdown(self) -> None:
        """Abort whatever is in flight and stop the step thread."""
        with self.inbox_lock:
            self.stopping = True
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
