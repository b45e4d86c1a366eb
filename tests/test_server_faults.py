"""A server you can leave running: a full queue answers 429 with Retry-After and its bound; a dead engine
answers 503 and ends the streams in flight; SIGTERM lets in-flight requests finish and exits 0."""

import asyncio
import os
import signal
import subprocess
import sys
import threading

import httpx
from test_server_cli import REPO, free_port, wait_for_health
from test_server_harness import MODEL, engine_idle, serve, sse_payloads, tiny_engine, wait_until
from tiny_checkpoints import make_tiny_hf_config, random_state_dict, write_hf_checkpoint

COMPLETIONS = "/v1/completions"


def blocked_steps(engine, monkeypatch) -> threading.Event:
    """Every engine step waits until the returned event is set."""
    release, step = threading.Event(), engine.step
    monkeypatch.setattr(engine, "step", lambda: (release.wait(), step())[1])
    return release


def test_a_full_queue_answers_429_with_retry_after_and_the_bound(monkeypatch):
    engine = tiny_engine(max_num_seqs=2)
    release = blocked_steps(engine, monkeypatch)
    added, add = [], engine.add_prepared
    monkeypatch.setattr(engine, "add_prepared", lambda *args, **kwargs: (added.append(1), add(*args, **kwargs))[1])
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 4}
    with serve(engine, max_queue=1) as server:
        serving = server.app.state.serving

        async def main():
            async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
                held = [asyncio.ensure_future(client.post(COMPLETIONS, json=body)) for _ in range(3)]
                for _ in range(2000):
                    if serving.admitted == 3:
                        break
                    await asyncio.sleep(0.01)
                assert serving.admitted == 3, "three requests were never admitted"
                refused = await client.post(COMPLETIONS, json=body)
                too_many = await client.post(COMPLETIONS, json={**body, "n": 4})
                release.set()
                return refused, too_many, await asyncio.gather(*held)

        try:
            refused, too_many, held = asyncio.run(main())
        finally:
            release.set()
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["code"] == "queue_full" and error["type"] == "rate_limit_error"
        assert (error["capacity"], error["max_num_seqs"], error["max_queue"], error["admitted"]) == (3, 2, 1, 3)
        assert "bound of 3" in error["message"] and "--max-queue" in error["message"]
        assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "n"
        assert [response.status_code for response in held] == [200] * 3
        assert len(added) == 3                    # nothing was queued beyond the bound
        wait_until(lambda: engine_idle(engine), what="engine idle")


def stream_lines(server, body: dict, lines: list, first_chunk: threading.Event) -> threading.Thread:
    def read():
        with httpx.stream("POST", server.url(COMPLETIONS), json={**body, "stream": True}, timeout=60) as response:
            for line in response.iter_lines():
                lines.append(line)
                first_chunk.set()
        first_chunk.set()
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_a_step_that_blocks_forever_is_found_by_the_watchdog(monkeypatch):
    """The third step never returns: within the watchdog's period /health turns 503, the stream in flight
    ends with an engine_dead error event, and a new request gets 503 at once."""
    engine = tiny_engine(speculative=None)
    release, step, steps = threading.Event(), engine.step, []

    def third_step_hangs():
        steps.append(1)
        if len(steps) >= 3:
            release.wait()
        return step()
    monkeypatch.setattr(engine, "step", third_step_hangs)
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 40, "ignore_eos": True}
    try:
        with serve(engine, watchdog_timeout=0.5) as server:
            lines, first_chunk = [], threading.Event()
            reader = stream_lines(server, body, lines, first_chunk)
            assert first_chunk.wait(60)
            wait_until(lambda: httpx.get(server.url("/health"), timeout=10).status_code == 503, what="/health 503")
            assert httpx.get(server.url("/health"), timeout=10).json()["error"]["code"] == "engine_dead"
            reader.join(60)
            payloads = sse_payloads(lines)
            assert payloads[-1] == "[DONE]" and payloads[-2]["error"]["code"] == "engine_dead"
            assert "watchdog" in payloads[-2]["error"]["message"]
            refused = httpx.post(server.url(COMPLETIONS), json=body, timeout=10)
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_dead"
            assert len(steps) == 3                        # the hung step is the last one started
    finally:
        release.set()


def test_serve_exits_1_once_the_engine_is_dead(tmp_path, monkeypatch):
    """`specwise serve` (run_serve, here on a thread) shuts down after a short drain and returns 1 for its
    supervisor when the engine dies."""
    from specwise.cli import build_parser
    from specwise.engine import async_engine as async_engine_module
    from specwise.server.cli import run_serve

    built = []

    class RecordedEngine(async_engine_module.AsyncEngine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)
    monkeypatch.setattr(async_engine_module, "AsyncEngine", RecordedEngine)
    config = make_tiny_hf_config()
    model = write_hf_checkpoint(tmp_path / "tiny-hf", config, random_state_dict(config))
    port = free_port()
    args = build_parser().parse_args(["serve", "--model", str(model), "--port", str(port), "--max-model-len", "64",
                                      "--num-kv-blocks", "32", "--no-compile"])
    status = []
    thread = threading.Thread(target=lambda: status.append(run_serve(args)), daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: healthy(base), timeout=120, what="server start")
    built[0].die("injected for the test")
    assert httpx.get(f"{base}/health", timeout=10).status_code == 503
    thread.join(60)
    assert status == [1]


def healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_sigterm_lets_in_flight_requests_finish_and_exits_0(tmp_path):
    config = make_tiny_hf_config()
    model = write_hf_checkpoint(tmp_path / "tiny-hf", config, random_state_dict(config))
    port = free_port()
    command = [sys.executable, "-m", "specwise.cli", "serve", "--model", str(model), "--port", str(port),
               "--max-model-len", "256", "--num-kv-blocks", "256", "--no-compile", "--num-threads", "1",
               "--shutdown-timeout", "60"]
    process = subprocess.Popen(command, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(process, base)
        body = {"model": "tiny-hf", "prompt": "The fox", "max_tokens": 200, "ignore_eos": True, "stream": True}
        streams = []
        for _ in range(4):
            lines, first_chunk = [], threading.Event()
            streams.append((lines, first_chunk, stream_lines(Base(base), body, lines, first_chunk)))
        assert all(first_chunk.wait(60) for _, first_chunk, _ in streams)
        process.send_signal(signal.SIGTERM)
        unfinished_at_signal = sum('"finish_reason":"length"' not in "".join(lines) for lines, _, _ in streams)
        for _, _, reader in streams:
            reader.join(120)
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr[-2000:]
        assert "server stopped" in stderr
        assert unfinished_at_signal > 0, "every stream had ended before SIGTERM: nothing was drained"
        for lines, _, _ in streams:
            payloads = sse_payloads(lines)
            assert payloads[-1] == "[DONE]" and payloads[-2]["choices"][0]["finish_reason"] == "length"
            assert sum(len(p["choices"][0]["text"]) > 0 for p in payloads[:-1]) > 0
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


class Base:
    """What stream_lines needs of a server: its URLs."""

    def __init__(self, base_url: str):
        self.base_url = base_url

    def url(self, path: str) -> str:
        return self.base_url + path
