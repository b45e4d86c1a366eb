"""`specwise serve`: the OpenAI-compatible server on one engine (EngineConfig + ServerConfig flags)."""

import argparse
import sys

from specwise.cli_args import add_dataclass_args, dataclass_from_args
from specwise.config import EngineConfig
from specwise.server.config import ServerConfig


def register(subparsers) -> None:
    parser = subparsers.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API",
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    # a server runs for hours: like vLLM, it compiles the model's forward by default (minutes at start-up,
    # then decode steps 1.4-1.7x faster, benchmarks/README.md); --no-compile starts in seconds
    add_dataclass_args(parser, EngineConfig, defaults={"compile": True})
    add_dataclass_args(parser, ServerConfig)
    parser.set_defaults(handler=run_serve)


def uvicorn_config(app, config: ServerConfig):
    import uvicorn
    return uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                          timeout_keep_alive=config.keep_alive_timeout,
                          timeout_graceful_shutdown=config.shutdown_timeout)


def run_serve(args) -> int:
    import uvicorn

    from specwise.engine.async_engine import AsyncEngine
    from specwise.engine.llm_engine import LLMEngine
    from specwise.server.app import api_keys, create_app

    config = dataclass_from_args(ServerConfig, args)
    engine_config = dataclass_from_args(EngineConfig, args)
    if not config.is_loopback and not api_keys(config):
        print(f"specwise: warning: serving on {config.host} without an API key: anyone who can reach this "
              f"address can use the model", file=sys.stderr)
    async_engine = AsyncEngine(lambda: LLMEngine(engine_config))                # built on the step thread
    print(f"specwise: engine: {async_engine.engine.kernel_line}", file=sys.stderr, flush=True)
    app = create_app(async_engine, config)
    print(f"specwise: serving {app.state.model!r} on http://{config.host}:{config.port}/v1", file=sys.stderr)
    try:
        uvicorn.Server(uvicorn_config(app, config)).run()
    except KeyboardInterrupt:   # uvicorn re-raises the SIGINT it already handled by shutting down
        pass
    print("specwise: server stopped", file=sys.stderr)
    return 0
