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
from specwise.server.responses import Responder

T = TypeVar("T")
DONE = "data: [DONE]\n\n"


class ClientDisconnected(APIError):
    def __init__(self):
        super().__init__(499, "the client disconnected", code="client_disconnected")


async def answer(request: Request, job: Job, responder: Responder, stream: bool) -> Response:
    if not stream:
        try:
            output = await until_disconnect(request, job.collect())
        finally:
            await job.close()
        return JSONResponse(responder.body(output))
    try:
        first = await until_disconnect(request, job.next())
    except BaseException:
        await job.close()
        raise
    return EventStream(job, events(job, first, responder))


async def until_disconnect(request: Request, awaitable: Awaitable[T]) -> T:
    """Await `awaitable`; cancel it and raise ClientDisconnected if the client goes away first."""
    work = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
    if work.cancelled():
        raise ClientDisconnected()
    return work.result()


async def wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def events(job: Job, first: RequestOutput, responder: Responder) -> AsyncIterator[str]:
    for payload in responder.opening_chunks():
        yield sse(payload)
    output = first
    try:
        while True:
            if output.new_text or output.finished:
                yield sse(responder.chunk(output))
            if output.finished:
                break
            output = await job.next()
        if responder.include_usage:
            yield sse(responder.usage_chunk(output))
    except APIError as error:
        yield sse(error.body())
    yield DONE


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


class EventStream(StreamingResponse):
    """A text/event-stream response that closes its job however the stream ends."""

    def __init__(self, job: Job, body: AsyncIterator[str]):
        super().__init__(body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()
            await self.job.close()
