"""Graceful shutdown: in-flight requests finish within the shutdown timeout, or are aborted after it."""

import threading
import time

import httpx
from test_server_harness import MODEL, ServerThread, engine_idle, sse_payloads, tiny_engine, wait_until

from specwise.server.config import ServerConfig


def start_stream(server: ServerThread, max_tokens: int) -> tuple[threading.Thread, threading.Event, dict]:
    """Stream one completion in a thread; the event fires at its first chunk."""
    first_chunk, result = threading.Event(), {"lines": [], "error": None}
    body = {"model": MODEL, "prompt": "abc", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}

    def read():
        try:
            with httpx.stream("POST", server.url("/v1/completions"), json=body, timeout=60) as response:
                for line in response.iter_lines():
                    result["lines"].append(line)
                    first_chunk.set()
        except httpx.HTTPError as error:
            result["error"] = error
        first_chunk.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, first_chunk, result


def shut_down_during_stream(shutdown_timeout: float, max_tokens: int, step_delay: float = 0.0):
    """`step_delay` seconds before every engine step keep the stream running for max_tokens * step_delay
    seconds at least, however fast the tiny model is and however late this thread gets to stop()."""
    engine = tiny_engine(speculative=None)
    step = engine.step

    def slow_step():
        time.sleep(step_delay)
        return step()
    engine.step = slow_step
    server = ServerThread(engine, ServerConfig(served_model_name=MODEL, shutdown_timeout=shutdown_timeout)).start()
    client, first_chunk, result = start_stream(server, max_tokens)
    assert first_chunk.wait(60)
    server.stop()
    client.join(60)
    assert not server.app.state.serving.async_engine.thread.is_alive()
    wait_until(lambda: engine_idle(engine), what="every KV block free after shutdown")
    return result


def test_shutdown_lets_in_flight_stream_finish():
    result = shut_down_during_stream(shutdown_timeout=60, max_tokens=40)
    payloads = sse_payloads(result["lines"])
    assert result["error"] is None and payloads[-1] == "[DONE]"
    assert "".join(p["choices"][0]["text"] for p in payloads[:-1]) != ""
    assert payloads[-2]["choices"][0]["finish_reason"] == "length"


def test_shutdown_timeout_aborts_in_flight_stream():
    result = shut_down_during_stream(shutdown_timeout=0.2, max_tokens=200, step_delay=0.05)
    assert "data: [DONE]" not in result["lines"]
