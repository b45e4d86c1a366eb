"""`specwise serve`'s app in this process, for benchmarks that reach into the engine (server_faults.py):
the same pieces `run_serve` puts together (AsyncEngine over LLMEngine, create_app, uvicorn_config), uvicorn
in a thread on 127.0.0.1 and a port the OS picks, stopped however the benchmark ends. serve_process.py runs
the server as a process of its own instead, for figures that the client must not share a GIL with.

    with ServerThread(EngineConfig(speculative="ngram", compile=None), ServerConfig()) as server:
        server.url("/v1/completions"), server.async_engine.engine, server.metrics()
"""

import socket
import threading
import time

import httpx
import uvicorn

from specwise.bench.load.targets.prometheus import parse_exposition
from specwise.config import EngineConfig
from specwise.engine.async_engine import AsyncEngine
from specwise.engine.llm_engine import LLMEngine
from specwise.server.app import create_app
from specwise.server.cli import uvicorn_config
from specwise.server.config import ServerConfig

START_TIMEOUT_S = 120.0         # the engine is built before the app; uvicorn itself starts in a second
STOP_TIMEOUT_S = 60.0


class ServerThread:
    def __init__(self, engine_config: EngineConfig, config: ServerConfig):
        self.engine_config, self.config = engine_config, config
        self.async_engine: AsyncEngine | None = None
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))      # bound here and handed to uvicorn: no race for the port
        self.base_url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"

    def __enter__(self) -> "ServerThread":
        try:
            self.async_engine = AsyncEngine(lambda: LLMEngine(self.engine_config))     # built on its step thread
            self.server = uvicorn.Server(uvicorn_config(create_app(self.async_engine, self.config), self.config))
            self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]},
                                           name="uvicorn", daemon=True)
            self.thread.start()
            deadline = time.monotonic() + START_TIMEOUT_S
            while not self.server.started:
                if not self.thread.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError("the in-process server did not start")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """uvicorn's graceful shutdown (the app's lifespan shuts the engine down), then the engine if it outlived it."""
        if self.thread is not None:
            self.server.should_exit = True
            self.thread.join(STOP_TIMEOUT_S)
            if self.thread.is_alive():
                raise RuntimeError("the in-process server did not stop")
        if self.async_engine is not None and self.async_engine.thread.is_alive():
            self.async_engine.shutdown()
        self.socket.close()

    def url(self, path: str) -> str:
        return self.base_url + path

    def metrics(self, timeout: float = 30) -> dict[tuple, float]:
        """{(name, frozenset(labels)): value} from GET /metrics."""
        text = httpx.get(self.url("/metrics"), timeout=timeout).text
        return {(name, frozenset(labels.items())): value for name, labels, value in parse_exposition(text)}
