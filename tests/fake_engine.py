"""A stand-in for `vllm serve` / `python -m sglang.launch_server` in the launcher's tests.

    python tests/fake_engine.py [serve] [MODEL] --host H --port P [--model M | --model-path M]
        [--speculative-config JSON | --speculative-algorithm A --speculative-num-draft-tokens N ...]
        [--per-request-spec-decode-metrics summary]

Serves GET /health, /v1/models, /version, /metrics (vLLM's spec-decode counters, its KV cache) and streams
POST /v1/completions and /v1/chat/completions: one chunk per step, STEP_DELAY seconds a step;
a speculating server emits 1 + accepted tokens a step, accepted = step % (k + 1), and with
--per-request-spec-decode-metrics puts vLLM 0.32's `metrics.speculative_decoding` on the usage
chunk. Started as SGLang (--model-path), it answers a request that asks with
"return_spec_tokens_details" with SGLang 0.5.23's `sglext.spec_tokens_details` chunk and publishes
SGLang's gauges (sglang:spec_accept_rate, sglang:spec_accept_length) instead of vLLM's counters.
Unknown flags are rejected like argparse does (exit 2, "error: unrecognized arguments").
Behaviour from the environment:
  FAKE_ENGINE_START_DELAY   seconds before it listens (default 0.2)
  FAKE_ENGINE_HANG          1: never listens (prints "loading weights" and sleeps)
  FAKE_ENGINE_CRASH_AFTER   N: exits (code 3) in the middle of its Nth completion request
  FAKE_ENGINE_CRASH_SPEC    1: only a speculating server crashes
  FAKE_ENGINE_PID_DIR       writes <pid>.pid there for itself and its helper child
  FAKE_ENGINE_CHILD         1: forks a helper process that lives as long as it (vLLM's engine core)
  FAKE_ENGINE_OLD           1: has no --per-request-spec-decode-metrics (a vLLM before 0.32) and, as
                            SGLang, no per-request details (an SGLang before them)
  FAKE_ENGINE_IGNORE_TERM   1: ignores SIGTERM, noting it in <pid>.term (the launcher must SIGKILL it)
  FAKE_ENGINE_STEP_DELAY    seconds per step (default 0.002)
  FAKE_ENGINE_DRIFT_FILE    a file counting the starts so far (missing: none): the nth start (from 0) runs its
                            steps at STEP_DELAY * (1 + FAKE_ENGINE_DRIFT * n), a machine whose speed drifts
                            linearly from one server start to the next, whichever arm starts
  FAKE_ENGINE_STEP_COST     "FIXED,PER_TOKEN,PER_KV[,PER_ROW]" seconds: a batching engine instead (Stepper below),
                            whose step time is that known function of the step's rows, KV tokens and sampled rows
  FAKE_ENGINE_TOKEN_BUDGET  N: that engine prefills a longer prompt in chunks of N tokens, a step each (as
                            vLLM and ours do within max_num_batched_tokens); it says N nowhere, as vLLM does not
  FAKE_ENGINE_COUNT_COST    "SECONDS,MEMORY": that engine's step whose row count is not among the last MEMORY
                            distinct counts it ran takes SECONDS more (an eager server building its kernels)
  FAKE_ENGINE_GROUPED_READS "GROUP,BLOCK,SECONDS": that engine reads the cache as ours does: sequences fed as many
                            rows, sorted by context, GROUP at a time, each to its group's longest context in
                            whole blocks of BLOCK tokens (the padding costs as KV tokens), SECONDS a group; its
                            /health says {"kv_reads": {"group_size": GROUP, "block_size": BLOCK}}
  FAKE_ENGINE_STEP_LOG      1: that engine says its steps on GET /steps?after=N[&limit=M] as `specwise serve` does
                            ({"steps": [{"seconds", "fed", "cached", "sampled", "prompt_tokens"}, ...], "next": n}),
                            each step's seconds its cost as STEP_COST gives it (what it sleeps to)
Prompts count 1 token per 4 characters, or a token-id prompt its ids; `stream_options.continuous_usage_stats` puts the running usage on
every chunk, as vLLM does.
"""

import argparse
import collections
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ENV = os.environ.get
COUNTERS = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [], "requests": 0}
LOCK = threading.Lock()


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fake_engine")
    parser.add_argument("words", nargs="*")              # "serve" and/or a positional model
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model")
    parser.add_argument("--model-path")
    parser.add_argument("--speculative-config")
    if ENV("FAKE_ENGINE_OLD") != "1":         # FAKE_ENGINE_OLD=1: a vLLM before 0.32, without the flag
        parser.add_argument("--per-request-spec-decode-metrics", choices=("none", "summary", "detailed"))
    parser.add_argument("--speculative-algorithm")
    parser.add_argument("--speculative-num-draft-tokens", type=int)
    parser.add_argument("--speculative-num-steps", type=int)
    parser.add_argument("--speculative-eagle-topk", type=int)
    parser.add_argument("--speculative-draft-model-path")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--max-num-seqs", type=int)             # taken, not obeyed
    parser.add_argument("--max-num-batched-tokens", type=int)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--dtype")
    args = parser.parse_args()
    per_request = getattr(args, "per_request_spec_decode_metrics", None)
    if per_request not in (None, "none") and not args.speculative_config:
        parser.exit(1, "ValueError: --per-request-spec-decode-metrics requires speculative decoding "
                       "to be enabled (via --speculative-config).\n")
    return args


def draft_k(args) -> int:
    if args.speculative_config:
        return int(json.loads(args.speculative_config)["num_speculative_tokens"])
    if args.speculative_num_draft_tokens:
        return args.speculative_num_draft_tokens - 1
    return 0


def main() -> None:
    args = parse()
    pid_dir = ENV("FAKE_ENGINE_PID_DIR")
    if ENV("FAKE_ENGINE_IGNORE_TERM") == "1":        # noted in <pid>.term, then ignored
        signal.signal(signal.SIGTERM, lambda *_: pid_dir and open(os.path.join(pid_dir, f"{os.getpid()}.term"),
                                                                   "w").close())
    if ENV("FAKE_ENGINE_CHILD") == "1":
        child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
        if pid_dir:
            open(os.path.join(pid_dir, f"{child.pid}.pid"), "w").close()
    if pid_dir:
        open(os.path.join(pid_dir, f"{os.getpid()}.pid"), "w").close()
    print(f"fake engine {os.getpid()}: loading weights for {args.model or args.model_path or args.words}",
          flush=True)
    if ENV("FAKE_ENGINE_HANG") == "1":
        while True:
            time.sleep(1)
    time.sleep(float(ENV("FAKE_ENGINE_START_DELAY", "0.2")))
    delay = float(ENV("FAKE_ENGINE_STEP_DELAY", "0.002")) * slowdown()
    model = args.model or args.model_path or next((w for w in args.words if w != "serve"), "fake")
    handler = make_handler(model, draft_k(args), getattr(args, "per_request_spec_decode_metrics", None) == "summary",
                           delay, sglang=args.model_path is not None)
    ThreadingHTTPServer.request_queue_size = 128     # a wave of requests connects at once (the default backlog is 5)
    server = ThreadingHTTPServer((args.host, args.port), handler)
    server.daemon_threads = True
    print(f"fake engine serving on {args.host}:{args.port}", flush=True)
    server.serve_forever()


def slowdown() -> float:
    path = ENV("FAKE_ENGINE_DRIFT_FILE")
    if not path:
        return 1.0
    starts = int(open(path).read()) if os.path.exists(path) else 0
    with open(path, "w") as file:
        file.write(str(starts + 1))
    return 1 + float(ENV("FAKE_ENGINE_DRIFT", "0")) * starts


class Stepper:
    """One step thread batches every running request, as a serving engine does: a request's first step
    prefills its whole prompt (rows = prompt tokens, 1 sampled row; with a token budget, its first steps a
    chunk of at most that many tokens each, over the chunks before it as KV tokens, the last one sampling
    1 row), each later step decodes it with its k
    drafts (1 + k rows, all sampled, over prompt + made - 1 cached tokens), emitting 1 + accepted tokens,
    accepted = its step % (k + 1). A step lasts fixed + per_token x rows + per_kv x KV tokens + per_row x
    sampled rows, paced against the clock: while busy each step starts at the previous one's deadline, so
    late wake-ups do not add up."""

    def __init__(self, coefficients: list[float], k: int, budget: int | None = None,
                 count_cost: tuple[float, int] = (0.0, 0), grouped: tuple[int, int, float] | None = None):
        self.fixed, self.per_token, self.per_kv = coefficients[:3]
        self.grouped = grouped
        self.new_count, self.memory = count_cost
        self.counts = collections.OrderedDict()        # the row counts run lately, least recent first
        self.budget = budget
        self.per_row = coefficients[3] if len(coefficients) > 3 else 0.0
        self.k, self.running, self.cond = k, [], threading.Condition()
        self.steps: list[dict] | None = [] if ENV("FAKE_ENGINE_STEP_LOG") == "1" else None
        threading.Thread(target=self.loop, daemon=True).start()

    def submit(self, prompt_tokens: int, want: int) -> queue.Queue:
        """A queue that gets the tokens each step emits for this request, then None."""
        request = {"prompt": prompt_tokens, "want": want, "made": 0, "steps": 0, "filled": 0, "out": queue.Queue()}
        with self.cond:
            self.running.append(request)
            self.cond.notify()
        return request["out"]

    def loop(self) -> None:
        end, busy = time.monotonic(), False
        while True:
            with self.cond:
                while not self.running:
                    busy = False
                    self.cond.wait()
                batch = list(self.running)
            rows = sampled = kv = 0
            chunks, reads = {}, []          # reads: (rows fed, context) of each sequence that reads its cache
            fed, cached = [], []            # the step's line (FAKE_ENGINE_STEP_LOG)
            for r in batch:
                if r["made"] == 0:
                    chunks[id(r)] = chunk = min(r["prompt"] - r["filled"], self.budget or r["prompt"])
                    rows, kv = rows + chunk, kv + r["filled"]
                    sampled += 1 if r["filled"] + chunk == r["prompt"] else 0
                    if r["filled"]:
                        reads.append((chunk, r["filled"] + chunk))
                    fed.append(chunk)
                    cached.append(r["filled"])
                else:
                    rows, sampled, kv = rows + 1 + self.k, sampled + 1 + self.k, kv + r["prompt"] + r["made"] - 1
                    reads.append((1 + self.k, r["prompt"] + r["made"] + self.k))
                    fed.append(1 + self.k)
                    cached.append(r["prompt"] + r["made"] - 1)
            padding, groups = self.groups(reads)
            start = end if busy else time.monotonic()
            end = start + self.fixed + self.per_token * rows + self.per_kv * (kv + padding) + self.per_row * sampled
            end += groups * (self.grouped[2] if self.grouped else 0.0)
            end += self.count_cost(rows)
            busy = True
            time.sleep(max(end - time.monotonic(), 0.0))
            if self.steps is not None:
                with self.cond:
                    # its cost, as scheduled: timed from the last step's scheduled end, a step held its own late
                    # wake-up (the thread beside the HTTP server's), never its predecessor's (the fixed cost fitted
                    # 1-2.5% high); timed from when it began, it lost the work of emitting the last step's tokens
                    # (the cost a sampled row 1-2% low)
                    self.steps.append({"seconds": end - start, "fed": fed, "cached": cached,
                                       "sampled": sampled, "prompt_tokens": sum(chunks.values())})
            for r in batch:
                if id(r) in chunks:
                    r["filled"] += chunks[id(r)]
                    if r["filled"] < r["prompt"]:
                        continue                    # more of its prompt to prefill: nothing to emit yet
                accepted = min(r["steps"] % (self.k + 1), r["want"] - r["made"] - 1) if r["made"] and self.k else 0
                r["steps"] += 1 if r["made"] else 0
                r["made"] += 1 + accepted
                r["out"].put(1 + accepted)
                if r["made"] >= r["want"]:
                    with self.cond:
                        self.running.remove(r)
                    r["out"].put(None)


    def groups(self, reads: list[tuple[int, int]]) -> tuple[int, int]:
        """(KV tokens read past the sequences' own contexts, groups read) of one step's cache reads."""
        if not self.grouped:
            return 0, 0
        size, block, _ = self.grouped
        padding = groups = 0
        for fed in {rows for rows, _ in reads}:
            contexts = sorted(context for rows, context in reads if rows == fed)
            for first in range(0, len(contexts), size):
                members = contexts[first:first + size]
                padding += sum(-(-members[-1] // block) * block - context for context in members)
                groups += 1
        return padding, groups

    def count_cost(self, rows: int) -> float:
        if not self.new_count:
            return 0.0
        if rows in self.counts:
            self.counts.move_to_end(rows)
            return 0.0
        self.counts[rows] = None
        if len(self.counts) > self.memory:
            self.counts.popitem(last=False)
        return self.new_count


def prompt_tokens(body: dict) -> int:
    if isinstance(body.get("prompt"), list):
        return len(body["prompt"])                  # token ids
    text = body.get("prompt") or "".join(str(m.get("content", "")) for m in body.get("messages") or [])
    return max(1, len(text) // 4)


def make_handler(model: str, k: int, per_request: bool, delay: float, sglang: bool = False):
    cost = ENV("FAKE_ENGINE_STEP_COST")
    budget = int(ENV("FAKE_ENGINE_TOKEN_BUDGET", "0")) or None
    count = ENV("FAKE_ENGINE_COUNT_COST")
    count_cost = (float(count.split(",")[0]), int(count.split(",")[1])) if count else (0.0, 0)
    grouped = ENV("FAKE_ENGINE_GROUPED_READS")
    grouped = (int(grouped.split(",")[0]), int(grouped.split(",")[1]), float(grouped.split(",")[2])) if grouped else None
    stepper = Stepper([float(value) for value in cost.split(",")], k, budget, count_cost, grouped) if cost else None
    crash_after = int(ENV("FAKE_ENGINE_CRASH_AFTER", "0"))
    crashes = crash_after and (k > 0 or ENV("FAKE_ENGINE_CRASH_SPEC") != "1")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _json(self, payload, status=200, content="application/json"):
            body = payload if isinstance(payload, str) else json.dumps(payload)
            self.send_response(status)
            self.send_header("Content-Type", content)
            self.send_header("Content-Length", str(len(body.encode())))
            self.end_headers()
            self.wfile.write(body.encode())

        def do_GET(self):
            if self.path == "/health" and grouped:
                self._json({"kv_reads": {"group_size": grouped[0], "block_size": grouped[1]}})
            elif self.path == "/health":
                self._json("", content="text/plain")
            elif self.path.startswith("/steps") and stepper and stepper.steps is not None:
                query = dict(part.split("=") for part in self.path.partition("?")[2].split("&") if part)
                after, limit = int(query.get("after", 0)), query.get("limit")
                with stepper.cond:
                    lines = stepper.steps[after:after + int(limit) if limit is not None else None]
                    self._json({"steps": lines, "next": len(stepper.steps)})
            elif self.path == "/v1/models":
                self._json({"object": "list", "data": [{"id": model, "object": "model"}]})
            elif self.path == "/version":
                self._json({"version": "0.0.1-fake"})
            elif self.path == "/metrics":
                self._json(sglang_metrics_text() if sglang else metrics_text(), content="text/plain")
            else:
                self._json({"detail": "Not Found"}, status=404)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            with LOCK:
                COUNTERS["requests"] += 1
                number = COUNTERS["requests"]
            chat = self.path.endswith("/chat/completions")
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            want, step, made = int(body.get("max_tokens") or 16), 0, 0
            prompt = prompt_tokens(body) if stepper else 7
            continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
            histogram, drafted = [0] * (k + 1), 0
            steps = stepper.submit(prompt, want) if stepper else None
            while made < want:
                if steps is not None:
                    tokens = steps.get()
                    accepted = tokens - 1 if made else None      # the prefill's token is no verification
                else:
                    time.sleep(delay)
                    accepted = min(step % (k + 1), max(want - made - 1, 0)) if k else 0
                    tokens = accepted + 1
                if k and accepted is not None:
                    histogram[accepted] += 1
                    drafted += k
                made += tokens
                step += 1
                text = "tok " * tokens
                choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
                event = {"choices": [choice]}
                if continuous:
                    event["usage"] = {"prompt_tokens": prompt, "completion_tokens": made}
                self._event(event)
                if crashes and number == crash_after and step == 2:
                    os._exit(3)
            if k:
                with LOCK:
                    record(histogram, drafted)
            usage = {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": made,
                                              "total_tokens": prompt + made}}
            if k and per_request:
                steps = sum(histogram)
                accepted = sum(j * n for j, n in enumerate(histogram))
                usage["metrics"] = {"speculative_decoding": {
                    "mean_acceptance_length": 1 + accepted / steps if steps else 1.0,
                    "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
                    "acceptance_histogram": histogram, "num_spec_steps": steps,
                    "num_accepted_draft_tokens": accepted, "num_draft_tokens": drafted, "num_spec_tokens": k}}
            if k and sglang and body.get("return_spec_tokens_details") and ENV("FAKE_ENGINE_OLD") != "1":
                self._event({"choices": [], "sglext": {"spec_tokens_details": {
                    "spec_verify_ct": sum(histogram), "spec_num_proposed_drafts": drafted,
                    "spec_num_correct_drafts": sum(j * n for j, n in enumerate(histogram)),
                    "spec_accept_length": made / sum(histogram), "spec_correct_drafts_histogram": histogram}}})
            self._event(usage)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def _event(self, payload):
            self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
            self.wfile.flush()

    return Handler


def record(histogram, drafted) -> None:
    COUNTERS["drafts"] += sum(histogram)
    COUNTERS["draft_tokens"] += drafted
    COUNTERS["accepted"] += sum(j * n for j, n in enumerate(histogram))
    positions = len(histogram) - 1
    COUNTERS["per_pos"] += [0] * (positions - len(COUNTERS["per_pos"]))
    for position in range(positions):
        COUNTERS["per_pos"][position] += sum(histogram[position + 1:])


CACHE_BLOCK_SIZE, CACHE_BLOCKS = 16, 4096      # its vllm:cache_config_info: 65,536 KV tokens


def metrics_text() -> str:
    lines = [f"vllm:spec_decode_num_drafts_total {COUNTERS['drafts']}",
             f"vllm:spec_decode_num_draft_tokens_total {COUNTERS['draft_tokens']}",
             f"vllm:spec_decode_num_accepted_tokens_total {COUNTERS['accepted']}"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {n}'
              for i, n in enumerate(COUNTERS["per_pos"])]
    # its KV cache as vLLM says it (a few of the real page's labels; tests/data/vllm-0.32-cpu-ngram-metrics.txt)
    lines.append(f'vllm:cache_config_info{{block_size="{CACHE_BLOCK_SIZE}",cache_dtype="auto",'
                 f'num_gpu_blocks="{CACHE_BLOCKS}",num_cpu_blocks="None"}} 1.0')
    return "\n".join(lines) + "\n"


def sglang_metrics_text() -> str:
    """SGLang's gauges, over every request so far (SGLang's own are windowed averages)."""
    drafts, drafted, accepted = COUNTERS["drafts"], COUNTERS["draft_tokens"], COUNTERS["accepted"]
    if not drafts:
        return "sglang:num_running_reqs 0\n"
    return (f"sglang:spec_accept_rate {accepted / drafted}\n"
            f"sglang:spec_accept_length {1 + accepted / drafts}\n")


if __name__ == "__main__":
    main()
