"""Answer a started Job: one JSON body, or server-sent events ending in `data: [DONE]`.

A client that disconnects is noticed while the answer is being computed (non-streamed,
or before a stream's first token) by watching the connection, and during a stream by
Starlette, which cancels the body iterator. Either way the job is closed, which aborts
the request in the engine and frees its KV blocks.
"""

import asyncio
import contextlib
import json
from typing import AsyncIterator, Awaitable, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from specwise.engine.outputs import RequestOutput
from specwise.server.errors import APIError
from specwise.server.generation import Job
from specwise.server.responses import Finished, Responder, usage

T = TypeVar("T")
DONE = "data: [DONE]\n\n"


class ClientDisconnected(APIError):
    def __init__(self):
        super().__init__(499, "the client disconnected", code="client_disconnected")


async def answer(request: Request, jobs: list[Job], responder: Responder, stream: bool) -> Response:
    """Answer the n jobs of one request (one per choice)."""
    if not stream:
        try:
            outputs = await until_disconnect(request, asyncio.gather(*(job.collect() for job in jobs)))
        finally:
            await close_all(jobs)
        return JSONResponse(responder.body([Finished(output, job.logprobs, job.prompt_logprobs, job.cumulative_logprob)
                                           for output, job in zip(outputs, jobs)]))
    try:
        firsts = await until_disconnect(request, asyncio.gather(*(job.next() for job in jobs)))
    except BaseException:
        await close_all(jobs)
        raise
    return EventStream(jobs, events(jobs, firsts, responder))


async def close_all(jobs: list[Job]) -> None:
    for job in jobs:
        await job.close()


async def until_disconnect(request: Request, awaitable: Awaitable[T]) -> T:
    """Await `awaitable`; cancel it and raise ClientDisconnected if the client goes away first.

    Whether the work finished is read from asyncio.wait's done set, not from work.cancelled(): a
    cancelled gather() is not cancelled() but done with a CancelledError as its result.
    """
    work = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
    if work not in done:
        raise ClientDisconnected()
    return work.result()


async def wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def events(jobs: list[Job], firsts: list[RequestOutput], responder: Responder) -> AsyncIterator[str]:
    """Chunks of every choice as their steps arrive; usage so far counts every choice's tokens."""
    prompt_tokens = len(firsts[0].prompt_token_ids)
    completion = [0] * len(jobs)
    for payload in responder.opening_chunks(len(jobs), prompt_tokens):
        yield sse(payload)
    queue: asyncio.Queue = asyncio.Queue()
    for index, first in enumerate(firsts):
        queue.put_nowait((index, first))
    readers = [asyncio.ensure_future(read(job, index, queue)) for index, (job, first) in enumerate(zip(jobs, firsts))
               if not first.finished]
    remaining = len(jobs)                  # choices whose finished output is still to come
    try:
        while remaining:
            index, item = await queue.get()
            if isinstance(item, APIError):
                yield sse(item.body())
                break
            completion[index] = len(item.output_token_ids)
            payload = responder.chunk(index, item, usage(prompt_tokens, sum(completion)))
            if payload is not None:
                yield sse(payload)
            remaining -= item.finished
        if responder.include_usage and not remaining:
            yield sse(responder.usage_chunk(usage(prompt_tokens, sum(completion))))
    finally:
        for reader in readers:
            reader.cancel()
    yield DONE


async def read(job: Job, index: int, queue: asyncio.Queue) -> None:
    """Put each next output of a job (after its first) on the queue, or the APIError that ended it."""
    try:
        while True:
            output = await job.next()
            queue.put_nowait((index, output))
            if output.finished:
                return
    except APIError as error:
        queue.put_nowait((index, error))


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


class EventStream(StreamingResponse):
    """A text/event-stream response that closes its jobs however the stream ends."""

    def __init__(self, jobs: list[Job], body: AsyncIterator[str]):
        super().__init__(body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.jobs = jobs

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()
            await close_all(self.jobs)
