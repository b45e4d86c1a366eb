"""`specwise serve`: the OpenAI-compatible server on one engine (EngineConfig + ServerConfig flags).

Start-up under --compile (the default): the compiled graphs when the compile cache holds them (seconds), else
the eager engine at once while another process compiles them, switching over when they are ready
(engine/background_compile.py); --wait-for-compile (or SPECWISE_COMPILE_CACHE=off, which leaves the other
process nowhere to put them) compiles them before serving.

Exit status: 0 after SIGINT or SIGTERM (in-flight requests get --shutdown-timeout seconds to finish,
new connections are refused meanwhile); 1 when the engine died (async_engine.py), after
DEAD_DRAIN_S seconds in which the error events of the streams it ended are sent, so a supervisor
restarts a fresh process.
"""

import argparse
import gc
import importlib.util
import signal
import sys
import threading

from specwise.cli_args import add_dataclass_args, dataclass_from_args
from specwise.config import EngineConfig
from specwise.models.kernel_caches import bound_kernel_caches
from specwise.server.config import ServerConfig

DEAD_DRAIN_S = 2.0          # from the engine's death to the server's shutdown


class Terminated(Exception):
    """SIGTERM, re-raised by uvicorn once it has shut down gracefully (as it re-raises SIGINT)."""


def _terminated(signum, frame):
    raise Terminated()


def register(subparsers) -> None:
    parser = subparsers.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API",
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    # a server runs for hours: like vLLM, it compiles the model's forward by default (minutes at start-up,
    # then decode steps 1.4-1.7x faster, benchmarks/README.md); --no-compile starts in seconds
    add_dataclass_args(parser, EngineConfig, defaults={"compile": True})
    add_dataclass_args(parser, ServerConfig)
    parser.set_defaults(handler=run_serve)


def uvicorn_config(app, config: ServerConfig):
    """uvicorn with httptools' HTTP parser (C) and uvloop's event loop where it is installed (not on Windows).

    Against h11 (pure Python) and asyncio's loop, with settle_heap's frozen startup objects in both, /health's
    worst answer while 1,000 clients arrived at once went from 0.4-0.9 s to 9-23 ms (overload.py, 2-core VM
    at load 2.5-6):
    the event loop parses, admits or refuses and answers each arriving request, sharing the GIL with the
    engine's step thread, and the C parser and loop do that per request in a fraction of the interpreter time.
    """
    import uvicorn
    return uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                          timeout_keep_alive=config.keep_alive_timeout,
                          timeout_graceful_shutdown=config.shutdown_timeout,
                          http="httptools", loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio")


def run_serve(args) -> int:
    import uvicorn

    from specwise.engine.async_engine import AsyncEngine
    from specwise.engine.background_compile import BackgroundCompile
    from specwise.engine.llm_engine import LLMEngine
    from specwise.models.compile.cache import cache_root
    from specwise.server.app import api_keys, create_app

    config = dataclass_from_args(ServerConfig, args)
    engine_config = dataclass_from_args(EngineConfig, args)
    bound_kernel_caches()           # before the first kernel runs: a server meets new shapes for hours
    if not config.is_loopback and not api_keys(config):
        print(f"specwise: warning: serving on {config.host} without an API key: anyone who can reach this "
              f"address can use the model", file=sys.stderr)
    if engine_config.compile and not config.wait_for_compile and cache_root() is not None:
        engine_config.compile = None        # the cached graphs, else eager now and compiled in the background
    async_engine = AsyncEngine(lambda: LLMEngine(engine_config))     # built on the step thread
    print(f"specwise: engine: {async_engine.engine.kernel_line}", file=sys.stderr, flush=True)
    app = create_app(async_engine, config)
    server = uvicorn.Server(uvicorn_config(app, config))
    async_engine.on_dead.append(lambda reason: exit_after_drain(server))
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)      # else the re-raised SIGTERM kills the process: status -15
    background = None
    try:
        if async_engine.engine.pending_compile is not None:
            background = BackgroundCompile(async_engine, on_switched=settle_heap)
        print(f"specwise: serving {app.state.model!r} on http://{config.host}:{config.port}/v1", file=sys.stderr)
        settle_heap()
        server.run()
    except (KeyboardInterrupt, Terminated):   # uvicorn re-raises the signal it already handled by shutting down
        pass
    finally:
        if background is not None:
            background.stop()               # no compile process outlives the server, however it ends
    if async_engine.dead is not None:
        print(f"specwise: the engine is dead ({async_engine.dead}); exiting with status 1", file=sys.stderr)
        return 1
    print("specwise: server stopped", file=sys.stderr)
    return 0


def settle_heap() -> None:
    """Move every object alive now (modules, the model, the tokenizer, the app; after the switch, the compiled
    graphs' Python side) into the garbage collector's permanent generation, after collecting today's garbage.

    A full collection walks every tracked object while every other thread, the event loop's included, waits for
    the GIL: with the default model served eagerly, 328k objects, 190 ms a collection on the 2-core VM, and under
    overload (overload.py --diagnose) 4 of its 8 full collections took 100-250 ms, the longest /health stalls.
    Frozen, they are never walked again (a full collection then takes microseconds); what serving creates is
    collected as before.
    """
    gc.collect()
    gc.freeze()


def exit_after_drain(server) -> None:
    """Ask uvicorn to shut down DEAD_DRAIN_S seconds from now (any thread: it polls should_exit)."""
    timer = threading.Timer(DEAD_DRAIN_S, lambda: setattr(server, "should_exit", True))
    timer.daemon = True
    timer.start()
