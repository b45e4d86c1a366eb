"""A server you can leave running: a full queue answers 429 with Retry-After and its bound; a dead engine
answers 503 and ends the streams in flight; SIGTERM lets in-flight requests finish and exits 0."""

import asyncio
import threading

import httpx
from test_server_harness import MODEL, engine_idle, serve, tiny_engine, wait_until

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
