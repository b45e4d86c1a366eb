"""Any OpenAI-compatible endpoint (vLLM, SGLang, our own server) as an evaluation target.

Streams `/v1/completions` or `/v1/chat/completions` with `stream_options.include_usage`,
reads the server-sent events up to `data: [DONE]`, and turns transport failures, HTTP
errors and error objects inside the stream into TargetError (counted, never a crash).
With `continuous_usage` (vLLM's and our server's `stream_options.continuous_usage_stats`) every
chunk carries the running completion count, so each chunk knows how many tokens it holds (a
text-less chunk's tokens go to the next chunk with text).
Each response's own speculative counters (our server's, vLLM's, SGLang's) are read as per-request
acceptance (targets/per_request.py); `extra_body` adds fields to every request (SGLang's ask for them).
"""

import json
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

import httpx

from specwise.bench.load.targets.base import ServerAcceptance, StreamEvent, TargetError, TokenChunk, Usage
from specwise.bench.load.targets.per_request import per_request_acceptance
from specwise.bench.load.targets.prometheus import scrape, vllm_cache_limits
from specwise.bench.inputs.request import WorkloadRequest
from specwise.engine.cost.kv_reads import KVReads
from specwise.errors import ConfigError

APIS = ("auto", "completions", "chat")


@dataclass
class HttpTarget:
    name: str
    base_url: str
    method: str = "http"
    api: str = "auto"                   # auto: chat for requests with messages, else completions
    model: str | None = None            # None: the first id from GET /v1/models
    temperature: float = 0.0
    timeout: float = 300.0
    metrics_url: str | None = None      # None: <base>/metrics
    headers: dict = field(default_factory=dict)
    continuous_usage: bool = False      # usage on every chunk: each chunk's token count (calibration)
    extra_body: dict = field(default_factory=dict)     # more fields in every request's body
    _client: httpx.AsyncClient | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.api not in APIS:
            raise ConfigError(f"api must be one of {', '.join(APIS)}, got {self.api!r}")
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"endpoint {self.name!r}: URL must start with http:// or https://, "
                              f"got {self.base_url!r}")
        self.root = server_root(self.base_url)
        self.metrics_url = self.metrics_url or f"{self.root}/metrics"

    async def start(self) -> None:
        self._client = self._new_client()
        if self.model is None:
            self.model = await self.first_model()

    def _new_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=httpx.Timeout(self.timeout, connect=10.0), headers=self.headers,
                                 limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))

    async def reconnect(self) -> None:
        """Before a wave: the connections left open closed, and one opened (GET /v1/models).
        An idle server prefills first the prompt that reaches it first: the wave's first request, on
        that connection, while the others open theirs. Left as they were, the connections a round
        finds open depend on what ran before it (the point's counter scrape left one to the first
        arm's first round alone; a round within the server's keep-alive of the last found a dozen),
        and with several open or none, which prompt goes first is a race (docs/design.md,
        "Measurement rules")."""
        await self._client.aclose()
        self._client = self._new_client()
        try:
            await self._client.get(f"{self.root}/v1/models")
        except httpx.HTTPError:
            pass                        # the wave's own requests say what is wrong

    async def activate(self) -> None:
        pass

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def server_acceptance(self) -> ServerAcceptance | None:
        return await scrape(self._client, self.metrics_url)

    async def stream(self, request: WorkloadRequest) -> AsyncIterator[StreamEvent]:
        chat = self.api == "chat" or (self.api == "auto" and request.messages is not None)
        url = f"{self.root}/v1/{'chat/completions' if chat else 'completions'}"
        try:
            async with self._client.stream("POST", url, json=self._body(request, chat)) as response:
                if response.status_code >= 400:
                    detail = (await response.aread()).decode("utf-8", "replace")
                    raise TargetError(f"HTTP {response.status_code}: {_short(_error_text(detail))}")
                async for event in self._events(response, chat):
                    yield event
        except httpx.ConnectError:
            raise TargetError(f"cannot connect to {self.root}") from None
        except httpx.TimeoutException as error:
            raise TargetError(f"timed out ({type(error).__name__}) after {self.timeout:g}s limit") from None
        except httpx.HTTPError as error:
            raise TargetError(f"{type(error).__name__}: {_short(str(error))}") from None

    async def _events(self, response: httpx.Response, chat: bool) -> AsyncIterator[StreamEvent]:
        counted = 0                     # completion tokens already given to chunks (continuous usage)
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                payload = json.loads(data)
            except json.JSONDecodeError:
                payload = None
            if not isinstance(payload, dict):
                raise TargetError(f"malformed event in stream: {_short(data)}")
            if payload.get("error") or payload.get("object") == "error":
                raise TargetError(f"error in stream: {_short(_error_text(data))}")
            usage = payload.get("usage")
            for choice in payload.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                if text:
                    tokens = None
                    if self.continuous_usage and usage and usage.get("completion_tokens") is not None:
                        tokens, counted = usage["completion_tokens"] - counted, usage["completion_tokens"]
                    yield TokenChunk(time=time.perf_counter(), text=text, tokens=tokens)
            if usage:
                yield Usage(usage.get("prompt_tokens"), usage.get("completion_tokens"))
            acceptance = per_request_acceptance(payload)
            if acceptance is not None:
                yield acceptance
        raise TargetError("stream ended without data: [DONE]")

    def _body(self, request: WorkloadRequest, chat: bool) -> dict:
        body = {"max_tokens": request.max_tokens, "temperature": self.temperature, "stream": True,
                "stream_options": {"include_usage": True} | ({"continuous_usage_stats": True}
                                                             if self.continuous_usage else {})}
        if self.model:
            body["model"] = self.model
        if chat:
            body["messages"] = request.messages or [{"role": "user", "content": request.prompt}]
        elif request.extra.get("prompt_token_ids"):
            body["prompt"] = list(request.extra["prompt_token_ids"])        # a completion prompt may be token ids
        else:
            body["prompt"] = request.prompt or "\n\n".join(m["content"] for m in request.messages)
        if request.ignore_eos:
            body.update(ignore_eos=True, min_tokens=request.max_tokens)
        body.update(self.extra_body)
        return body

    async def first_model(self) -> str | None:
        try:
            response = await self._client.get(f"{self.root}/v1/models", timeout=10.0)
            return response.json()["data"][0]["id"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
            return None


def server_root(base_url: str) -> str:
    """http://h:8000/v1/ -> http://h:8000: where /health, /metrics and /v1/... hang."""
    return base_url.rstrip("/").removesuffix("/v1")


async def check_endpoint(name: str, base_url: str, headers: dict | None = None) -> None:
    """Before measuring: any HTTP answer from the endpoint will do; no answer stops the run."""
    root = server_root(base_url)
    if not root.startswith(("http://", "https://")):
        raise ConfigError(f"endpoint {name!r}: URL must start with http:// or https://, got {base_url!r}")
    try:
        async with httpx.AsyncClient(timeout=10.0, headers=headers or {}) as client:
            await client.get(f"{root}/v1/models")
    except httpx.HTTPError as error:
        raise ConfigError(f"endpoint {name!r} at {base_url} does not answer ({type(error).__name__}); "
                          f"nothing was measured: start it, or drop --endpoint {name}=...") from None


@dataclass(frozen=True)
class ServerSays:
    """What a server says of its scheduler and KV cache, each None where it does not say it."""
    max_num_batched_tokens: int | None = None   # the most tokens a step takes
    kv_reads: KVReads | None = None             # how its attention reads the cache
    max_num_seqs: int | None = None             # the most sequences a step runs
    block_size: int | None = None               # tokens a KV-cache block
    kv_cache_tokens: int | None = None          # the KV cache, tokens

    def limits(self) -> dict:
        """The scheduler and KV-cache figures said, by name (run.json "said": what `simulate --validate` reads)."""
        return {name: value for name in LIMITS if (value := getattr(self, name)) is not None}


LIMITS = ("max_num_seqs", "max_num_batched_tokens", "block_size", "kv_cache_tokens")


async def announced(base_url: str, headers: dict | None = None) -> ServerSays:
    """What the server says of itself where a client can read it. `specwise serve`, on /health: its token
    budget a step, how its attention reads the cache, its most sequences a step, its block size and KV cache.
    vLLM, on /metrics (vllm:cache_config_info): its block size and KV cache blocks; its budget and most
    sequences nowhere. SGLang: nothing read."""
    root = server_root(base_url)
    async with httpx.AsyncClient(timeout=10.0, headers=headers or {}) as client:
        said = await _json(client, f"{root}/health")
        said = said if isinstance(said, dict) else {}
        if "block_size" not in said:
            said |= await _vllm_cache(client, f"{root}/metrics")
    return ServerSays(_count(said.get("max_num_batched_tokens")), KVReads.from_json(said.get("kv_reads")),
                      _count(said.get("max_num_seqs")), _count(said.get("block_size")),
                      _count(said.get("kv_cache_tokens")))


async def server_steps(base_url: str, after: int, limit: int | None = None,
                       headers: dict | None = None) -> tuple[list[dict], int] | None:
    """(the steps the server ran, numbered from 0, from `after` on, at most `limit`; the next step's number):
    `specwise serve`'s GET /steps (engine/step_log.py), each {"seconds", "fed", "cached", "sampled",
    "prompt_tokens", ...}; limit 0: the next number alone, a mark. None where the server says none (vLLM,
    SGLang), or says them in another shape."""
    query = f"after={after}" + (f"&limit={limit}" if limit is not None else "")
    async with httpx.AsyncClient(timeout=60.0, headers=headers or {}) as client:
        said = await _json(client, f"{server_root(base_url)}/steps?{query}")
    following = said.get("next") if isinstance(said, dict) else None
    if not isinstance(following, int) or isinstance(following, bool) or not isinstance(said.get("steps"), list):
        return None
    lines = said["steps"]
    if not all(isinstance(line, dict) and {"seconds", "fed", "cached", "sampled"} <= line.keys() for line in lines):
        return None
    return lines, following


async def _json(client: httpx.AsyncClient, url: str):
    try:
        return (await client.get(url)).json()
    except (httpx.HTTPError, ValueError):
        return None


async def _vllm_cache(client: httpx.AsyncClient, url: str) -> dict:
    try:
        response = await client.get(url)
    except httpx.HTTPError:
        return {}
    return vllm_cache_limits(response.text) if response.status_code == 200 else {}


def _count(value) -> int | None:
    """A positive int, else None (not said)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _error_text(body: str) -> str:
    """The message of an error object, {"error": {"message": ...}} (OpenAI) or
    {"object": "error", "message": ...} (vLLM), else the body itself."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    error = data.get("error", data) if isinstance(data, dict) else data
    return str(error.get("message", error)) if isinstance(error, dict) else str(error)


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."
