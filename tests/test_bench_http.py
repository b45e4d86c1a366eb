"""The HTTP target against a real local server streaming server-sent events.

SSEServer is a small OpenAI-compatible server (stdlib, threaded, 127.0.0.1 only): it
streams `max_tokens` words in chunks of `tokens_per_chunk`, ends with a usage chunk and
`data: [DONE]`, can fail every n-th request with HTTP 500, break a stream midway or hang
one (a stream longer than `hang_after` chunks stops there until the server closes: a
request that outlives any bound, however fast or slow the machine), and publishes
vLLM-style speculative counters on /metrics when `tokens_per_chunk` > 1.
"""

import asyncio
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specwise.bench.load.arrivals import LoadPoint
from specwise.bench.load.measure import Slot, measure
from specwise.bench.load.targets.http import HttpTarget
from specwise.bench.inputs.request import WorkloadRequest


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass            # clients hanging up on keep-alive connections are expected


class SSEServer:
    def __init__(self, delay=0.002, tokens_per_chunk=1, fail_every=0, break_every=0, accept_per_draft=2,
                 usage=True, extension=False, hang_after=None):
        self.delay, self.tokens_per_chunk, self.usage = delay, tokens_per_chunk, usage
        self.hang_after, self.closing = hang_after, threading.Event()
        self.extension = extension          # per-request counters in the last chunk, as our server does
        self.fail_every, self.break_every, self.accept_per_draft = fail_every, break_every, accept_per_draft
        self.requests = 0
        self.bodies = []
        self.authorization = []
        self.seen = []                      # (path, the client's port: one a connection, the prompt or None)
        self.counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0}
        self.lock = threading.Lock()
        self.httpd = QuietServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.closing.set()                  # hung streams end (their clients are gone)
        self.httpd.shutdown()
        self.httpd.server_close()

    def metrics_text(self) -> str:
        c = self.counters
        return ("# TYPE vllm:spec_decode_num_drafts counter\n"
                f'vllm:spec_decode_num_drafts_total{{model_name="fake"}} {c["drafts"]}\n'
                f'vllm:spec_decode_num_draft_tokens_total{{model_name="fake"}} {c["draft_tokens"]}\n'
                f'vllm:spec_decode_num_accepted_tokens_total{{model_name="fake"}} {c["accepted"]}\n')

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                with server.lock:
                    server.seen.append((self.path, self.client_address[1], None))
                if self.path == "/v1/models":
                    self._send(200, json.dumps({"data": [{"id": "fake-model"}]}), "application/json")
                elif self.path == "/metrics" and server.tokens_per_chunk > 1:
                    self._send(200, server.metrics_text(), "text/plain")
                else:
                    self._send(404, "not found", "text/plain")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests += 1
                    number = server.requests
                    server.bodies.append(body)
                    server.seen.append((self.path, self.client_address[1], body.get("prompt")))
                    server.authorization.append(self.headers.get("Authorization"))
                if server.fail_every and number % server.fail_every == 0:
                    self._send(500, json.dumps({"error": {"message": "overloaded, try later"}}), "application/json")
                    return
                self._stream(body, chat=self.path.endswith("/chat/completions"),
                             broken=bool(server.break_every and number % server.break_every == 0))

            def _stream(self, body, chat, broken):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                total, step = body["max_tokens"], server.tokens_per_chunk
                for start in range(0, total, step):
                    if server.hang_after is not None and start >= server.hang_after * step:
                        server.closing.wait()
                        self.close_connection = True
                        return
                    if broken and start >= total // 2:
                        self.wfile.write(b"5\r\ndata:")      # half a chunk, then hang up
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        self.close_connection = True
                        return
                    words = "w " * min(step, total - start)
                    choice = {"index": 0, "delta": {"content": words}} if chat else {"index": 0, "text": words}
                    payload = {"choices": [choice]}
                    if (body["stream_options"] or {}).get("continuous_usage_stats"):     # vLLM's running usage
                        payload["usage"] = {"prompt_tokens": 3, "completion_tokens": min(start + step, total)}
                    if server.extension and start + step >= total:
                        drafts = -(-total // step)
                        payload["specwise"] = {"speculative": True, "drafts": drafts, "draft_tokens": 4 * drafts,
                                               "accepted_tokens": total - drafts, "accepted_per_position": [drafts]}
                    self._event(payload)
                    if step > 1:
                        with server.lock:
                            server.counters["drafts"] += 1
                            server.counters["draft_tokens"] += step - 1
                            server.counters["accepted"] += min(server.accept_per_draft, step - 1)
                    time.sleep(server.delay)
                prompt = body.get("prompt") or " ".join(m["content"] for m in body.get("messages", []))
                if server.usage:
                    self._event({"choices": [], "usage": {"prompt_tokens": len(prompt.split()),
                                                          "completion_tokens": total}})
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")

            def _event(self, payload):
                self._chunk(f"data: {json.dumps(payload)}\n\n".encode())

            def _chunk(self, data: bytes):
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _send(self, status, text, content_type):
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def request(max_tokens=8, chat=False, rid="r1") -> WorkloadRequest:
    if chat:
        return WorkloadRequest(rid, "chat", messages=[{"role": "user", "content": "say hi"}], max_tokens=max_tokens)
    return WorkloadRequest(rid, "code_editing", prompt="one two three", max_tokens=max_tokens)


def run_one(target: HttpTarget, workload_request: WorkloadRequest, timeout=10.0):
    async def go():
        await target.start()
        try:
            return await measure(target, workload_request, Slot("concurrency", 1, time.perf_counter()), timeout)
        finally:
            await target.close()
    return asyncio.run(go())


@pytest.mark.parametrize("chat", [False, True])
def test_streams_chunks_and_takes_usage(chat):
    with SSEServer(delay=0.003) as server:
        record = run_one(HttpTarget("off", server.url), request(max_tokens=6, chat=chat))
        body = server.bodies[0]
    assert record.error is None
    assert record.output_tokens == 6 and len(record.chunk_times) == 6
    assert record.prompt_tokens == (2 if chat else 3)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == "fake-model"
    assert ("messages" in body) == chat
    assert record.ttft == record.chunk_times[0] and record.e2e >= record.chunk_times[-1]
    assert all(b > a for a, b in zip(record.chunk_times, record.chunk_times[1:]))


def test_continuous_usage_gives_each_chunk_its_tokens():
    """7 tokens streamed 3 a chunk: chunks of 3, 3 and 1, counted by the server's running usage."""
    with SSEServer(tokens_per_chunk=3) as server:
        record = run_one(HttpTarget("off", server.url, continuous_usage=True), request(max_tokens=7))
        body = server.bodies[0]
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert record.chunk_tokens == [3, 3, 1] and record.output_tokens == 7
    with SSEServer(tokens_per_chunk=3) as server:
        assert run_one(HttpTarget("off", server.url), request(max_tokens=7)).chunk_tokens == []


def test_trace_requests_force_the_output_length():
    forced = WorkloadRequest("t", "trace", prompt="x " * 20, max_tokens=5, ignore_eos=True)
    with SSEServer() as server:
        run_one(HttpTarget("off", server.url), forced)
        body = server.bodies[0]
    assert body["ignore_eos"] is True and body["min_tokens"] == 5


def test_http_500_is_an_error_record_with_the_server_message():
    with SSEServer(fail_every=1) as server:
        record = run_one(HttpTarget("off", server.url), request())
    assert record.error == "HTTP 500: overloaded, try later"
    assert record.output_tokens == 0 and record.ttft is None


def test_broken_stream_keeps_what_arrived():
    with SSEServer(break_every=1) as server:
        record = run_one(HttpTarget("off", server.url), request(max_tokens=8))
    assert record.error is not None
    assert len(record.chunk_times) == 4


def test_unreachable_endpoint_is_an_error_not_a_crash():
    with SSEServer() as server:
        url = server.url
    record = run_one(HttpTarget("off", url), request())
    assert record.error.startswith("cannot connect to")


def test_slow_server_times_out():
    """The stream hangs after its first chunk: the request times out with that chunk kept, however
    long the (generous) timeout and however slow the machine."""
    with SSEServer(hang_after=1) as server:
        record = run_one(HttpTarget("off", server.url), request(max_tokens=20), timeout=2.0)
    assert record.error == "timed out after 2s"
    assert len(record.chunk_times) == 1


def test_server_counters_are_differenced():
    async def go(server):
        target = HttpTarget("vllm-ngram", server.url, method="ngram")
        await target.start()
        before = await target.server_acceptance()
        for rid in ("a", "b"):
            await measure(target, request(max_tokens=9, rid=rid), Slot("concurrency", 1, 0.0), 10)
        after = await target.server_acceptance()
        await target.close()
        return before, after

    from specwise.bench.load.targets.prometheus import difference
    with SSEServer(tokens_per_chunk=3, accept_per_draft=1) as server:
        run_one(HttpTarget("x", server.url), request(max_tokens=6))     # traffic before the point
        before, after = asyncio.run(go(server))
    counted = difference(before, after)
    # 2 requests x 3 chunks of 3 tokens: 6 drafts of 2 draft tokens, 1 accepted each
    assert (counted.drafts, counted.draft_tokens, counted.accepted_tokens) == (6, 12, 6)
    assert counted.source == "vllm"


def test_no_metrics_page_means_unknown():
    async def go(server):
        target = HttpTarget("off", server.url)
        await target.start()
        try:
            return await target.server_acceptance()
        finally:
            await target.close()
    with SSEServer() as server:
        assert asyncio.run(go(server)) is None


def test_load_point_label():
    assert LoadPoint("concurrency", 4).label() == "concurrency 4"


def test_without_usage_the_local_tokenizer_counts(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from specwise.bench.load.token_counter import LocalTokenizer
    words = Tokenizer(models.WordLevel({"w": 0, "one": 1, "[UNK]": 2}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.save(str(tmp_path / "tokenizer.json"))
    tokenizer = LocalTokenizer(tmp_path)
    with SSEServer(tokens_per_chunk=3, usage=False) as server:
        async def go():
            target = HttpTarget("off", server.url)
            await target.start()
            try:
                counted = await measure(target, request(max_tokens=7), Slot("concurrency", 1, 0.0), 10, tokenizer)
                chunked = await measure(target, request(max_tokens=7), Slot("concurrency", 1, 0.0), 10)
                return counted, chunked
            finally:
                await target.close()
        counted, chunked = asyncio.run(go())
    assert (counted.output_tokens, counted.prompt_tokens) == (7, 3)   # "one two three": one, [UNK], [UNK]
    assert (chunked.output_tokens, chunked.prompt_tokens) == (3, 0)   # no usage, no tokenizer: chunks
    assert counted.chunk_tokens == []


def test_per_request_counters_from_our_servers_last_chunk():
    with SSEServer(tokens_per_chunk=3, extension=True) as server:
        record = run_one(HttpTarget("specwise-ngram", server.url), request(max_tokens=9))
    # 9 tokens in 3 steps: 3 drafts of 4 tokens, 6 accepted
    assert (record.drafts, record.draft_tokens, record.accepted_tokens) == (3, 12, 6)
    assert record.accepted_per_position == [3]


def test_error_bodies_of_openai_and_vllm_shapes():
    from specwise.bench.load.targets.http import _error_text
    assert _error_text('{"error": {"message": "model not found", "code": 404}}') == "model not found"
    assert _error_text('{"object": "error", "message": "max_tokens too large", "code": 400}') == "max_tokens too large"
    assert _error_text("<html>Bad Gateway</html>") == "<html>Bad Gateway</html>"


def test_a_token_id_prompt_is_sent_as_token_ids():
    """A request that carries prompt_token_ids (the calibration's count probe) sends them as the completion prompt."""
    ids = WorkloadRequest("ids", "counts", max_tokens=1, prompt_tokens=3, extra={"prompt_token_ids": [101, 102, 103]})
    with SSEServer() as server:
        run_one(HttpTarget("off", server.url), ids)
        body = server.bodies[0]
    assert body["prompt"] == [101, 102, 103]


def test_each_wave_starts_with_one_connection_open_for_its_first_request():
    """reconnect() before a wave: the connections the last wave left open are closed and one is opened;
    the wave's first request goes out on it, the others on connections of their own."""
    with SSEServer(delay=0.005) as server:
        async def wave(target, n):
            await target.reconnect()
            requests = [WorkloadRequest(f"w{n}-{i}", "chat", prompt=f"w{n}-{i}", max_tokens=3) for i in range(3)]
            slot = Slot("concurrency", 3, time.perf_counter())
            return await asyncio.gather(*(measure(target, r, slot, 10.0) for r in requests))

        async def go():
            target = HttpTarget("off", server.url)
            await target.start()
            try:
                for n in range(2):
                    assert all(record.error is None for record in await wave(target, n))
            finally:
                await target.close()
        asyncio.run(go())
        seen = server.seen
    # start's GET, then per wave: reconnect's GET, three POSTs
    assert [path for path, _, _ in seen] == ["/v1/models"] + 2 * (["/v1/models"] + 3 * ["/v1/completions"])
    for n, at in enumerate((1, 5)):
        opened, posts = seen[at][1], {prompt: port for _, port, prompt in seen[at + 1:at + 4]}
        earlier = {port for _, port, _ in seen[:at]}
        assert posts[f"w{n}-0"] == opened and opened not in earlier
        assert len({posts[f"w{n}-1"], posts[f"w{n}-2"], opened}) == 3
        assert not {posts[f"w{n}-1"], posts[f"w{n}-2"]} & earlier
