"""Shared pieces of the server tests (this module holds no tests).

`serve(engine, ...)` runs the real app under uvicorn in a thread, on 127.0.0.1 and a port
the OS picks, over an engine built from a tiny random checkpoint.
"""

import contextlib
import json
import socket
import threading
import time

import httpx
import uvicorn
from tiny_models import tiny_checkpoint

from specwise.bench.load.targets.prometheus import parse_exposition
from specwise.config import EngineConfig
from specwise.engine.async_engine import AsyncEngine
from specwise.engine.llm_engine import LLMEngine
from specwise.server.app import create_app
from specwise.server.cli import uvicorn_config
from specwise.server.config import ServerConfig

TINY_ENGINE = dict(dtype="float32", max_model_len=256, num_kv_blocks=96, max_num_seqs=8, speculative="ngram")
# tools in the system prompt (tool_prompt.py) take about 700 byte tokens
TOOLS_ENGINE = dict(max_model_len=1536, num_kv_blocks=512)
MODEL = "tiny"


def tiny_engine(**overrides) -> LLMEngine:
    """The tiny engine; a max_model_len over the tiny model's 512 positions lengthens them (same weights)."""
    config = EngineConfig(**{**TINY_ENGINE, **overrides})
    return LLMEngine(config, tiny_checkpoint(max_position_embeddings=max(512, config.max_model_len)))


class ServerThread:
    def __init__(self, engine: LLMEngine, config: ServerConfig):
        self.engine = engine
        self.config = config
        self.app = create_app(AsyncEngine(lambda: engine), config)
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn_config(self.app, config))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def start(self) -> "ServerThread":
        self.thread.start()
        wait_until(lambda: self.server.started, timeout=30, what="server start")
        return self

    def stop(self, timeout: float = 60) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "server thread did not stop"

    def url(self, path: str) -> str:
        return self.base_url + path

    def metrics(self) -> dict[tuple, float]:
        """{(name, frozenset(labels)): value} from GET /metrics."""
        text = httpx.get(self.url("/metrics"), timeout=10).text
        return {(name, frozenset(labels.items())): value for name, labels, value in parse_exposition(text)}


@contextlib.contextmanager
def serve(engine: LLMEngine | None = None, **config):
    running = ServerThread(engine or tiny_engine(), ServerConfig(**{"served_model_name": MODEL, **config})).start()
    try:
        yield running
    finally:
        running.stop()


def metric(samples: dict, name: str, **labels) -> float:
    return samples.get((name, frozenset((k, str(v)) for k, v in labels.items())), 0.0)


def wait_until(predicate, timeout: float = 20, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def engine_idle(engine: LLMEngine) -> bool:
    """No request left in the engine and every KV block free."""
    manager = engine.block_manager
    return not engine.requests and not engine.scheduler.has_unfinished() and \
        manager.num_free_blocks == manager.num_blocks


def sse_payloads(lines) -> list:
    """The JSON payloads of `data:` lines, with "[DONE]" kept as a string."""
    payloads = []
    for line in lines:
        if line.startswith("data:"):
            data = line[5:].strip()
            payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads
