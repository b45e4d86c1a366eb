"""The OpenAI-compatible HTTP API over an AsyncEngine: `create_app(async_engine, config)`.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /steps (all behind the
optional API keys), GET /health, GET /metrics. With several keys each key is a **tenant**:
its requests carry it into the engine (`Sequence.tenant`), so drafters that learn across
requests (suffix's global cache) never draft one key's text for another key's request. The app owns the engine's step thread:
entering its lifespan starts the step watchdog (`watchdog_timeout`), leaving it shuts the AsyncEngine
down (uvicorn first lets in-flight requests finish for `shutdown_timeout` seconds, then cancels them,
which aborts them). /health is 503 once the engine is dead (async_engine.py), and so is every new request.
"""

import asyncio
import contextlib
import hashlib
import hmac
import os
import time
from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import ClientDisconnect

from specwise.engine.async_engine import AsyncEngine
from specwise.models.checkpoints.default_model import FILENAME as DEFAULT_MODEL_FILE
from specwise.server.config import ServerConfig
from specwise.server.errors import APIError, install_error_handlers
from specwise.server.generation import Serving
from specwise.server.logprobs import LogprobFormatter
from specwise.server.metrics import StatusCounter
from specwise.server.protocol import COMPLETION_DEFAULT_MAX_TOKENS, ChatCompletionRequest, CompletionRequest
from specwise.server.responses import ChatResponder, CompletionResponder
from specwise.server.streaming import ClientDisconnected, answer

GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions")


def create_app(async_engine: AsyncEngine, config: ServerConfig | None = None) -> FastAPI:
    config = config or ServerConfig()
    serving = Serving(async_engine, config)
    model = config.served_model_name or model_name(async_engine.engine.config.model)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if config.watchdog_timeout:
            async_engine.start_watchdog(config.watchdog_timeout)
        yield
        await asyncio.to_thread(async_engine.shutdown)

    app = FastAPI(title="specwise", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serving = serving
    app.state.model = model
    install_error_handlers(app)
    app.add_middleware(StatusCounter, counter=serving.metrics.requests, routes=GENERATION_ROUTES)
    app.include_router(api_routes(serving, config, model, api_keys(config)))
    app.include_router(service_routes(serving))
    return app


def api_routes(serving: Serving, config: ServerConfig, model: str, keys: list[str]) -> APIRouter:
    router = APIRouter(dependencies=[Depends(key_check(keys))])
    started = int(time.time())

    @router.get("/v1/models")
    async def models():
        card = {"id": model, "object": "model", "created": started, "owned_by": "specwise",
                "max_model_len": serving.engine.max_model_len}
        return {"object": "list", "data": [card]}

    @router.get("/steps")
    async def steps(after: int = Query(0, ge=0), limit: int | None = Query(None, ge=0)):
        # the steps the engine ran, numbered from 0, from `after` on, at most `limit` (engine/step_log.py: the last
        # KEPT_STEPS), for `calibrate --endpoint` to fit; behind the keys, as a step's rows tell its requests' lengths
        lines, following = await asyncio.to_thread(serving.engine.step_log.since, after, limit)   # parsing: off the loop
        return {"steps": lines, "next": following}

    formatter = LogprobFormatter(serving.engine.tokenizer)

    @router.post("/v1/completions")
    async def completions(request: Request):
        body = CompletionRequest.model_validate_json(await read_body(request, config.max_body_bytes))
        check(body, model)
        prompt = body.single_prompt()
        jobs = await serving.start(prompt, body, "prompt", COMPLETION_DEFAULT_MAX_TOKENS,
                                   tenant=getattr(request.state, "tenant", None))
        echo = "" if not body.echo else prompt if isinstance(prompt, str) else serving.engine.tokenizer.decode(prompt)
        responder = CompletionResponder(model, jobs[0].speculative, body, formatter, echo)
        return await answer(request, jobs, responder, bool(body.stream))

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = ChatCompletionRequest.model_validate_json(await read_body(request, config.max_body_bytes))
        check(body, model)
        jobs = await serving.start(body.template_messages(), body, "messages", None, body.template_tools(),
                                   tenant=getattr(request.state, "tenant", None))
        return await answer(request, jobs, ChatResponder(model, jobs[0].speculative, body, formatter),
                            bool(body.stream))

    return router


def service_routes(serving: Serving) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health():
        if serving.async_engine.dead is not None:
            raise APIError(503, f"the engine is dead: {serving.async_engine.dead}", code="engine_dead")
        if not serving.async_engine.thread.is_alive():
            raise APIError(503, "the engine thread has stopped", code="engine_stopped")
        # which forward serves: "compiled" graphs, or "eager" (without --compile, or while they compile); the
        # token budget a step, which `calibrate --endpoint` needs to know how many steps a long prompt takes,
        # and how the attention reads the cache, which it needs to count a step's KV tokens read; the most
        # sequences a step and the KV cache, which `simulate --validate` needs to replay a run against it
        engine = serving.engine
        return {"status": "ok", "forward": "compiled" if engine.compiled else "eager",
                "max_num_batched_tokens": engine.config.max_num_batched_tokens,
                "kv_reads": engine.runner.kv_reads.to_json(), "max_num_seqs": engine.config.max_num_seqs,
                "block_size": engine.block_manager.block_size,
                "kv_cache_tokens": engine.block_manager.num_blocks * engine.block_manager.block_size}

    @router.get("/metrics")
    async def metrics():
        return Response(generate_latest(serving.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return router


def check(body, model: str) -> None:
    body.check_supported()
    if body.model is not None and body.model != model:
        raise APIError(404, f"the model {body.model!r} does not exist; this server serves {model!r}",
                       "model", "model_not_found")


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"the request body ({declared} bytes) exceeds the limit of {limit} bytes",
                       code="body_too_large")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise APIError(413, f"the request body exceeds the limit of {limit} bytes", code="body_too_large")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientDisconnected() from None
    return b"".join(chunks)


def key_check(keys: list[str]):
    """The dependency that checks 'Authorization: Bearer KEY' against every key (constant time
    each) and records the matching key's tenant on the request; no keys: open, one tenant."""
    tenants = {key: tenant_of(key) for key in keys}

    async def require_key(request: Request) -> None:
        if not keys:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        sent = token.strip().encode()
        matches = [key for key in keys if hmac.compare_digest(sent, key.encode())]
        if scheme.lower() != "bearer" or not matches:
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")
        request.state.tenant = tenants[matches[0]]
    return require_key


def tenant_of(key: str) -> str:
    """A tenant's name: a digest of its key, so the key itself is never kept beside its text."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def api_keys(config: ServerConfig) -> list[str]:
    """--api-key (comma-separated for several tenants), else $SPECWISE_API_KEY; [] = no key."""
    text = config.api_key or os.environ.get("SPECWISE_API_KEY") or ""
    return [key.strip() for key in text.split(",") if key.strip()]


def model_name(model_path: str | None) -> str:
    """The id clients send: the checkpoint's directory or file name (without .gguf)."""
    if model_path is None:
        return DEFAULT_MODEL_FILE.split(".")[0]
    return Path(model_path).expanduser().resolve().name.removesuffix(".gguf")
