"""Client disconnects abort their requests; a bounded load completes, backpressure aside, and the
/metrics counters add up to what the clients saw."""

import asyncio
import random
import time

import httpx
import pytest
from test_server_harness import MODEL, engine_idle, metric, serve, sse_payloads, wait_until

from specwise.server.streaming import ClientDisconnected, until_disconnect

NUM_REQUESTS, CONCURRENCY = 200, 32
PROMPTS = ["abcabcabcabc" * 3, "one two one two one two", "Once upon a time", "xyzxyzxyz xyz"]


@pytest.fixture(scope="module")
def server():
    with serve(max_queue=4) as running:          # holds max_num_seqs (8) + 4 requests: 429 beyond
        yield running


def test_stream_disconnect_aborts_and_frees_blocks(server):
    before = server.metrics()
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url("/v1/completions"), json=body, timeout=60) as response:
        lines = response.iter_lines()
        assert sse_payloads([next(lines), next(lines), next(lines)])   # a few chunks, then hang up
        assert server.engine.requests
    wait_until(lambda: engine_idle(server.engine), what="aborted stream to free its blocks")
    after = server.metrics()
    assert metric(after, "specwise:requests_finished_total", finish_reason="abort") == \
        metric(before, "specwise:requests_finished_total", finish_reason="abort") + 1
    assert metric(after, "specwise:num_requests_admitted") == 0


def test_non_streaming_disconnect_aborts(server, monkeypatch):
    # each step at least 50 ms, so 200 tokens (at most 5 a step) outlast the 0.5 s read timeout
    step = server.engine.step
    monkeypatch.setattr(server.engine, "step", lambda: (time.sleep(0.05), step())[1])
    aborted = metric(server.metrics(), "specwise:requests_finished_total", finish_reason="abort")
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 200, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url("/v1/completions"), json=body, timeout=httpx.Timeout(60, read=0.5))
    wait_until(lambda: engine_idle(server.engine), what="abandoned request to be aborted")
    after = server.metrics()
    assert metric(after, "specwise:requests_finished_total", finish_reason="abort") == aborted + 1
    assert metric(after, "specwise:requests_total", route="/v1/completions", status=499) == 1
    assert metric(after, "specwise:num_requests_admitted") == 0


async def one_request(client: httpx.AsyncClient, index: int, seen: dict) -> None:
    rng = random.Random(index)
    chat, stream = index % 2 == 0, index % 3 != 0
    body = {"model": MODEL, "max_tokens": rng.randint(4, 16), "temperature": rng.choice([0.0, 0.8]),
            "speculative": index % 5 != 0, "seed": index}
    prompt = rng.choice(PROMPTS)
    body.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    route = "/v1/chat/completions" if chat else "/v1/completions"
    while True:
        response = await client.post(route, json=body)
        if response.status_code != 429:
            break
        seen["rejected"] += 1
        assert response.json()["error"]["code"] == "queue_full" and response.headers["retry-after"] == "1"
        await asyncio.sleep(0.1)
    if response.status_code != 200:
        seen["errors"].append(f"{response.status_code}: {response.text[:200]}")
        return
    payloads = sse_payloads(response.text.splitlines()) if stream else [response.json()]
    usage = next(p["usage"] for p in payloads if isinstance(p, dict) and p.get("usage"))
    figures = next(p["specwise"] for p in payloads if isinstance(p, dict) and "specwise" in p)
    seen["completed"] += 1
    seen["prompt_tokens"] += usage["prompt_tokens"]
    seen["completion_tokens"] += usage["completion_tokens"]
    seen["drafts"] += figures["drafts"]
    seen["accepted_tokens"] += figures["accepted_tokens"]


async def run_load(base_url: str) -> dict:
    seen = dict(completed=0, rejected=0, errors=[], prompt_tokens=0, completion_tokens=0, drafts=0,
                accepted_tokens=0)
    gate = asyncio.Semaphore(CONCURRENCY)
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as client:
        async def gated(index):
            async with gate:
                await one_request(client, index, seen)
        await asyncio.gather(*(gated(index) for index in range(NUM_REQUESTS)))
    return seen


def test_bounded_load_completes_and_metrics_add_up(server):
    before = server.metrics()
    started = time.perf_counter()
    seen = asyncio.run(run_load(server.base_url))
    wall = time.perf_counter() - started
    print(f"\nload: {NUM_REQUESTS} requests at concurrency {CONCURRENCY}: {seen['completed']} completed, "
          f"{len(seen['errors'])} errors, {seen['rejected']} answered 429 (retried), {wall:.1f} s wall, "
          f"{seen['completion_tokens']} tokens, {seen['drafts']} drafts, {seen['accepted_tokens']} accepted tokens")
    assert seen["errors"] == []
    assert seen["completed"] == NUM_REQUESTS
    assert seen["rejected"] > 0                        # the bounded queue pushed back
    wait_until(lambda: engine_idle(server.engine), what="engine idle after the load")
    after = server.metrics()

    def delta(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    ok = sum(delta("specwise:requests_total", route=route, status=200)
             for route in ("/v1/completions", "/v1/chat/completions"))
    rejected = sum(delta("specwise:requests_total", route=route, status=429)
                   for route in ("/v1/completions", "/v1/chat/completions"))
    assert (ok, rejected) == (NUM_REQUESTS, seen["rejected"])
    finished = delta("specwise:requests_finished_total", finish_reason="length") + \
        delta("specwise:requests_finished_total", finish_reason="stop")
    assert finished == NUM_REQUESTS
    assert delta("specwise:prompt_tokens_total") == seen["prompt_tokens"]
    assert delta("specwise:generation_tokens_total") == seen["completion_tokens"]
    assert delta("specwise:spec_decode_num_drafts_total") == seen["drafts"]
    assert delta("specwise:spec_decode_num_accepted_tokens_total") == seen["accepted_tokens"]
    assert seen["drafts"] > 0
    assert delta("specwise:e2e_request_latency_seconds_count") == NUM_REQUESTS
    assert metric(after, "specwise:kv_cache_blocks_used") == 0
    assert metric(after, "specwise:num_requests_running") == metric(after, "specwise:num_requests_waiting") == 0
    positions = [value for (name, labels), value in after.items()
                 if name == "specwise:spec_decode_num_accepted_tokens_per_pos_total"]
    assert sum(positions) == metric(after, "specwise:spec_decode_num_accepted_tokens_total")


class DisconnectingRequest:
    """A request whose client has already gone: receive() says so at once."""

    async def receive(self):
        return {"type": "http.disconnect"}


@pytest.mark.parametrize("make_work", [lambda: asyncio.sleep(3600),
                                       lambda: asyncio.gather(asyncio.sleep(3600), asyncio.sleep(3600))],
                         ids=["coroutine", "gather"])
def test_until_disconnect_raises_client_disconnected(make_work):
    # A cancelled gather() is done with CancelledError as its result, not cancelled(): the disconnect must
    # still be a ClientDisconnected (a 499), not a CancelledError escaping as "Exception in ASGI application".
    async def run():
        with pytest.raises(ClientDisconnected):
            await until_disconnect(DisconnectingRequest(), make_work())

    asyncio.run(run())
