"""The engine seam for asyncio callers (server, evaluator): one thread drives `step()`.

Each request gets its own asyncio queue; outputs are handed to the caller's event loop
as the step produces them. A caller that stops listening (client disconnect, task
cancelled) aborts its request, which frees its KV blocks at once.
"""

import asyncio
import collections
import threading
import uuid
from typing import AsyncIterator

from specwise.engine.llm_engine import LLMEngine, Prompt
from specwise.engine.outputs import RequestOutput
from specwise.sampling_params import SamplingParams


class AsyncEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self.lock = threading.Lock()           # LLMEngine is not thread-safe
        self.queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self.work = threading.Event()
        self.stopping = False
        self.to_abort: collections.deque[str] = collections.deque()
        self.abandoned: set[str] = set()
        self.thread = threading.Thread(target=self._run, name="specwise-engine", daemon=True)
        self.thread.start()

    async def generate(self, prompt: Prompt, params: SamplingParams,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        request_id = request_id or uuid.uuid4().hex
        queue: asyncio.Queue = asyncio.Queue()
        self.queues[request_id] = (asyncio.get_running_loop(), queue)
        try:
            # in a worker thread: waiting for the lock (up to one step) must not stall the event loop
            await asyncio.to_thread(self._add, prompt, params, request_id)
        except asyncio.CancelledError:     # the add may still land, or already has
            self.queues.pop(request_id, None)
            self.abandoned.add(request_id)
            self.abort(request_id)
            raise
        except Exception:                  # refused: nothing was added
            self.queues.pop(request_id, None)
            raise
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

    def _add(self, prompt: Prompt, params: SamplingParams, request_id: str) -> None:
        with self.lock:
            if self.stopping:
                raise RuntimeError("the engine is shut down")
            if request_id in self.abandoned:        # the caller was cancelled before the add ran
                self.abandoned.discard(request_id)
                return
            self.engine.add_request(prompt, params, request_id)

    def abort(self, request_id: str) -> None:
        """Never blocks: the step thread aborts it before its next step."""
        self.to_abort.append(request_id)
        self.work.set()

    @property
    def num_in_flight(self) -> int:
        return len(self.queues)

    def _run(self) -> None:
        while not self.stopping:
            with self.lock:
                while self.to_abort:
                    request_id = self.to_abort.popleft()
                    if request_id in self.engine.requests:   # it was added: abort it, it needs no skip
                        self.abandoned.discard(request_id)
                    self.engine.abort(request_id)
                busy = self.engine.has_unfinished()
                outputs = self._step() if busy else []
            for output in outputs:
                self._deliver(output.request_id, output)
            if not busy:
                # a request added after the check above has set the event: wait() returns at once
                self.work.wait()
                self.work.clear()

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
        with self.lock:
            self.stopping = True
            for request_id in list(self.engine.requests):
                self.engine.abort(request_id)
            for output in self.engine.step():   # the "abort" outputs end the streams still listening
                self._deliver(output.request_id, output)
        self.work.set()
        self.thread.join(timeout=10)
