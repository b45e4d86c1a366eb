"""Does one request's fault in the engine step fail that request alone, on the real server and model?

    flock /tmp/specwise-heavy.lock timeout 1800 python benchmarks/server_faults.py
    python benchmarks/server_faults.py --seams proposer,nan-row --dtype auto    # any `serve` engine flag (bf16 here)

Runs `specwise serve`'s app in this process (server_thread.py: create_app over an AsyncEngine of the
default model, `--speculative ngram`, eager unless the compile cache holds the graphs: compile=None, as
serve starts), uvicorn on 127.0.0.1 on a port the OS picks, in a thread stopped however the script
ends. In fp32 (`--dtype float32` by default, not serve's auto): texts are compared, and token for token
holds in fp32 only; in bf16 a step's shape changes the rounding, so two clean runs of the same 15
requests already differ (docs/design.md, lossless).

For each seam of the step it sends 16 concurrent greedy requests over HTTP (different prompts,
--max-tokens each, ignore_eos; the 15 others 8 streamed and 7 whole, 8 chat and 7 completions),
one of them the faulty one, a completion, streamed or whole by seam: the seam is monkeypatched (on
the step thread, between steps) to raise only for that request, once it has --fault-after output
tokens. It compares the 15 others' texts with a clean run of the same 15 without the faulty request,
then checks /health and that the KV blocks and admitted requests are back to 0. Each seam runs --repeats times (the server must stay healthy after
repeated faults), and the clean run is repeated at the end (the control: the same 15 twice).
Checks per fault run: the faulty request answered 500 engine_error (streamed: 200, then an
engine_error event and [DONE]) naming the reason; the fault fired 1 to 5 times (1 + log2 16: a batch
bisected down to the request) and the engine logged one failed request; the 15 others 200, finish
reason "length", texts identical; /health 200; KV blocks in use and admitted requests 0. Exits 1 if
any check fails. Target (issue 33): the 15 identical, the server healthy.

Seams (tests/test_fault_isolation.py injects the same ones into the engine, tiny model):
  proposer            the n-gram proposer raises on any batch holding the request (bisected)
  grammar-drafts      its JSON-schema matcher's valid_prefix raises (fitting drafts: bisected)
  grammar-mask        its matcher's masks raises (logits processing: named, RequestFault)
  grammar-accept      its matcher's accept raises (commit: that request's directly)
  logits-processing   its repetition_penalty processing raises (named)
  nan-row             its processed logits are NaN (no finite maximum: named)
"""

import argparse
import asyncio
import json
import logging
import math
import sys
import time
from dataclasses import dataclass

import httpx
import torch
from serve_process import load_average, metric
from server_thread import ServerThread

from specwise.cli_args import add_dataclass_args, dataclass_from_args
from specwise.config import EngineConfig
from specwise.server.config import ServerConfig

PROMPTS = ["Write a short story about a lighthouse keeper.", "Explain how a bicycle works.",
           "List five facts about the moon.", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"",
           "What is the capital of France? Answer in one sentence.", "Describe the water cycle to a child.",
           "The quick brown fox jumps over the lazy dog. The quick brown fox",
           "Give three tips for learning a new language.", "Why is the sky blue?",
           "Write a haiku about autumn leaves.", "import numpy as np\n\ndef normalize(x):",
           "Summarize the plot of Romeo and Juliet.", "How do vaccines work?",
           "one two three four five six seven eight", "Name the planets of the solar system in order.",
           "Translate 'good morning' into Spanish, French and German."]
BAD = 6                         # the faulty request's index among the 16 (a completion)
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
# seam -> (the faulty request's extra settings, whether it streams, what its error message names)
SEAMS = {
    "proposer": ({}, True, "injected fault"),
    "grammar-drafts": ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}},
                       False, "injected fault"),
    "grammar-mask": ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}},
                     True, "logits processing"),
    "grammar-accept": ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}},
                       False, "injected fault"),
    "logits-processing": ({"repetition_penalty": 1.3}, True, "logits processing"),
    "nan-row": ({"repetition_penalty": 1.3}, False, "no finite maximum"),
}
IDLE_TIMEOUT_S = 120.0


@dataclass
class Answer:
    status: int
    text: str = ""
    finish_reason: str | None = None
    error: dict | None = None          # the error body, or a stream's error event
    done: bool = False                 # a stream ended with [DONE]


def request(index: int, model: str, max_tokens: int, extra: dict | None = None, stream: bool | None = None):
    """(route, body): odd indices stream, chat and completions alternate in pairs; the faulty one is a completion."""
    body = {"model": model, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0,
            "stream": index % 2 == 1 if stream is None else stream, **(extra or {})}
    if (index // 2) % 2 == 0 and index != BAD:
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": PROMPTS[index]}]}
    return "/v1/completions", {**body, "prompt": PROMPTS[index]}


async def send(client: httpx.AsyncClient, route: str, body: dict) -> Answer:
    if not body["stream"]:
        response = await client.post(route, json=body)
        data = response.json()
        if response.status_code != 200:
            return Answer(response.status_code, error=data.get("error"))
        choice = data["choices"][0]
        text = choice["text"] if "text" in choice else choice["message"]["content"]
        return Answer(200, text, choice["finish_reason"])
    async with client.stream("POST", route, json=body) as response:
        if response.status_code != 200:
            return Answer(response.status_code, error=json.loads(await response.aread()).get("error"))
        answer, pieces = Answer(200), []
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                answer.done = True
                continue
            payload = json.loads(data)
            if "error" in payload:
                answer.error = payload["error"]
            for choice in payload.get("choices", []):
                pieces.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
                answer.finish_reason = choice.get("finish_reason") or answer.finish_reason
        answer.text = "".join(pieces)
        return answer


async def wave(base_url: str, requests: dict[int, tuple[str, dict]]) -> dict[int, Answer]:
    """Every request at once; {index: answer}."""
    limits = httpx.Limits(max_connections=len(requests), max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        answers = await asyncio.gather(*(send(client, route, body) for route, body in requests.values()))
    return dict(zip(requests, answers))


class Patches:
    """Instance attributes set for one run and put back after it."""

    def __init__(self):
        self.undo: list = []

    def set(self, obj, name: str, value) -> None:
        had, old = name in vars(obj), vars(obj).get(name)
        setattr(obj, name, value)
        self.undo.append(lambda: setattr(obj, name, old) if had else delattr(obj, name))

    def restore(self) -> None:
        while self.undo:
            self.undo.pop()()


def inject(seam: str, engine, bad_ids: list[int], fault_after: int, fired: list, patches: Patches) -> None:
    """Monkeypatch seam so that it raises (or gives NaN) only for the request whose prompt is bad_ids, once it has
    fault_after output tokens; each firing appends to fired. Runs on the step thread, between steps."""
    def late(seq) -> bool:
        return seq.num_output_tokens >= fault_after and seq.prompt_token_ids == bad_ids

    def raising(original, when):
        def wrapped(*args, **kwargs):
            if when(*args):
                fired.append(1)
                raise RuntimeError("injected fault")
            return original(*args, **kwargs)
        return wrapped

    processing = engine.runner.processing
    if seam == "proposer":
        patches.set(engine.proposer, "propose",
                    raising(engine.proposer.propose, lambda seqs, k: any(late(seq) for seq in seqs)))
    elif seam.startswith("grammar-"):
        # the matcher is made when the request is added (LogitsProcessing.add, keyed by seq_id): patch it then
        method, add = {"grammar-drafts": "valid_prefix", "grammar-mask": "masks", "grammar-accept": "accept"}[seam], \
            processing.add

        def add_and_patch(seq):
            add(seq)
            if seq.prompt_token_ids == bad_ids:
                matcher = processing.matchers[seq.seq_id]
                setattr(matcher, method, raising(getattr(matcher, method), lambda *args: late(seq)))
        patches.set(processing, "add", add_and_patch)
    elif seam == "logits-processing":
        patches.set(processing, "_apply_seq",
                    raising(processing._apply_seq, lambda logits, seq, drafts: late(seq)))
    elif seam == "nan-row":
        original = processing._apply_seq

        def apply_seq(logits, seq, drafts):
            if late(seq):
                fired.append(1)
                return torch.full_like(logits, float("nan"))
            return original(logits, seq, drafts)
        patches.set(processing, "_apply_seq", apply_seq)
    else:
        raise ValueError(f"unknown seam {seam!r}")


class FailureLog(logging.Filter):
    """Counts the engine's 'request ... failed in the engine step' records and keeps them (and their tracebacks)
    off the terminal; every other record of the engine's log passes."""

    def __init__(self):
        super().__init__()
        self.failures: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if "failed in the engine step" in record.getMessage():
            self.failures.append(record.getMessage())
            return False
        return True


def idle_metrics(server: ServerThread) -> dict:
    """/metrics once nothing is admitted and no KV block is used, or after IDLE_TIMEOUT_S."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        samples = server.metrics()
        if (metric(samples, "specwise:num_requests_admitted") == 0 and
                metric(samples, "specwise:kv_cache_blocks_used") == 0) or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


def after_run(server: ServerThread) -> dict:
    samples = idle_metrics(server)
    health = httpx.get(server.url("/health"), timeout=30)
    return {"health": health.status_code, "health_ok": health.status_code == 200 and health.json()["status"] == "ok",
            "kv": metric(samples, "specwise:kv_cache_blocks_used"),
            "admitted": metric(samples, "specwise:num_requests_admitted")}


def describe_bad(answer: Answer) -> str:
    if answer.error is None:
        return f"{answer.status}, finish reason {answer.finish_reason}: no error"
    where = "stream error event" if answer.status == 200 else "body"
    return f"{answer.status} {answer.error.get('code')} ({where}): {answer.error.get('message')}"


def progress(name: str, *row) -> tuple:
    """The table's row (with the run's seconds, from its start given last), said at once on stdout."""
    *row, began = row
    seconds = time.monotonic() - began
    print(f"  {name}: {row[4]} identical, {'pass' if row[-1] else 'FAIL'} ({seconds:.0f} s, load average "
          f"{load_average()})", flush=True)
    return (name, *row, seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seams", default=",".join(SEAMS), help="comma-separated, of: " + ", ".join(SEAMS))
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--fault-after", type=int, default=3, help="output tokens the faulty request has first")
    parser.add_argument("--repeats", type=int, default=2, help="fault runs per seam")
    add_dataclass_args(parser, EngineConfig, defaults={"speculative": "ngram", "compile": None,
                                                          "dtype": "float32"})
    args = parser.parse_args()
    seams = args.seams.split(",")
    if unknown := [seam for seam in seams if seam not in SEAMS]:
        parser.error(f"unknown seam(s) {', '.join(unknown)}; known: {', '.join(SEAMS)}")
    engine_config = dataclass_from_args(EngineConfig, args)
    failures = FailureLog()
    logging.getLogger("specwise.engine").addFilter(failures)
    print(f"load average before: {load_average()}", flush=True)
    started = time.monotonic()
    with ServerThread(engine_config, ServerConfig(log_level="warning")) as server:
        engine = server.async_engine.engine
        model = httpx.get(server.url("/v1/models"), timeout=30).json()["data"][0]["id"]
        print(f"server_faults: {model}, {engine.kernel_line}, speculative {engine.config.speculative} "
              f"k={engine.config.num_speculative_tokens}, {torch.get_num_threads()} threads; 16 requests x "
              f"{args.max_tokens} tokens, fault after {args.fault_after}; serving at {server.base_url}", flush=True)
        good = {index: request(index, model, args.max_tokens) for index in range(len(PROMPTS)) if index != BAD}
        bad_ids = engine.encode(PROMPTS[BAD])
        began = time.monotonic()
        clean = asyncio.run(wave(server.base_url, good))
        ok = all(a.status == 200 and a.finish_reason == "length" for a in clean.values())
        if not ok:
            print(f"the clean run itself failed: {clean}", flush=True)
        after = after_run(server)
        ok &= after["health_ok"] and after["kv"] == 0 and after["admitted"] == 0
        rows = [progress("clean (15)", "-", "-", "-", "-", "-", after, ok, began)]
        for seam in seams:
            extra, stream, reason = SEAMS[seam]
            for attempt in range(1, args.repeats + 1):
                fired, patches = [], Patches()
                server.async_engine.call(lambda e: inject(seam, e, bad_ids, args.fault_after, fired, patches))
                logged, began = len(failures.failures), time.monotonic()
                try:
                    answers = asyncio.run(wave(server.base_url, {**good, BAD: request(BAD, model, args.max_tokens,
                                                                                       extra, stream)}))
                finally:
                    server.async_engine.call(lambda e: patches.restore())
                bad, after = answers.pop(BAD), after_run(server)
                same = sum(answers[i].status == 200 and answers[i].text == clean[i].text and
                           answers[i].finish_reason == clean[i].finish_reason for i in good)
                error = bad.error or {}
                bad_ok = error.get("code") == "engine_error" and reason in (error.get("message") or "") and \
                    (bad.status == 500 if not stream else bad.status == 200 and bad.done)
                fired_ok = 1 <= len(fired) <= 1 + math.ceil(math.log2(len(PROMPTS)))
                logged_now = len(failures.failures) - logged
                passed = bad_ok and fired_ok and same == len(good) and logged_now == 1 and after["health_ok"] and \
                    after["kv"] == 0 and after["admitted"] == 0
                ok &= passed
                rows.append(progress(f"{seam} #{attempt}", "stream" if stream else "whole", describe_bad(bad),
                                     len(fired), logged_now, f"{same}/{len(good)}", after, passed, began))
        began = time.monotonic()
        again = asyncio.run(wave(server.base_url, good))
        same, after = sum(again[i].text == clean[i].text for i in good), after_run(server)
        passed = same == len(good) and after["health_ok"] and after["kv"] == 0 and after["admitted"] == 0
        ok &= passed
        rows.append(progress("clean again (15)", "-", "-", "-", "-", f"{same}/{len(good)}", after, passed, began))
        load_after = load_average()
    print("\n| run | faulty request | its answer (status, code, message) | faults fired | failures logged | others "
          "identical to the clean run | /health after | KV blocks used after | admitted after | run s | checks |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")
    for name, kind, answer, fired, logged, same, after, passed, seconds in rows:
        print(f"| {name} | {kind} | {answer} | {fired} | {logged} | {same} | {after['health']} | {after['kv']:.0f} | "
              f"{after['admitted']:.0f} | {seconds:.0f} | {'pass' if passed else 'FAIL'} |")
    print(f"\n{time.monotonic() - started:.0f} s; load average after: {load_after}; "
          f"{'every check passed' if ok else 'SOME CHECK FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:          # the server has stopped (ServerThread's exit): no traceback
        print("server_faults: interrupted", file=sys.stderr)
        sys.exit(130)
