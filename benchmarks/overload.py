"""Does the API side answer while the engine is saturated? `specwise serve` under a bounded overload.

    flock /tmp/specwise-heavy.lock timeout 1800 python benchmarks/overload.py -- --no-compile
    python benchmarks/overload.py --requests 2000 --concurrency 1000 --diagnose -- --no-compile

Starts `specwise serve [flags after --]` on loopback (by PID; ended by PID whatever happens), sends
--requests streaming requests (chat and completions alternating, --max-tokens each, ignore_eos)
from --concurrency clients at once, every --drop-every-th client hanging up after its first chunks,
each request answered 429 not retried. Meanwhile probes.py probes /health, /metrics, /v1/models
and admission every 0.5 s from its own process. Prints per endpoint p50 / p99 / max, the requests
by outcome (200 whole, 200 dropped by the client, 429, other statuses, lost: no status or a stream
cut without [DONE]), the KV blocks in use and requests admitted once the load has ended, and the
load average. --diagnose runs the server through loop_stalls.py and prints the tail of its log
(where the event loop was while it was late). Targets (issue 33): /health p99 <= 100 ms and
max <= 1 s, nothing lost, KV back to 0.
"""

import argparse
import asyncio
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
from probes import PROBE_TIMEOUT_S, Probes, latency_summary
from serve_process import ROOT, ServeProcess, load_average, metric

PROMPTS = ["Write a short story about a lighthouse keeper.", "Explain how a bicycle works.",
           "List five facts about the moon.", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\""]
IDLE_TIMEOUT_S = 600.0


def request_body(index: int, model: str, max_tokens: int) -> tuple[str, dict]:
    prompt = PROMPTS[index % len(PROMPTS)]
    body = {"model": model, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0, "stream": True}
    if index % 2:
        return "/v1/completions", {**body, "prompt": prompt}
    return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}


async def one_request(client: httpx.AsyncClient, index: int, args, model: str, outcomes: collections.Counter,
                      header_seconds: dict) -> None:
    route, body = request_body(index, model, args.max_tokens)
    drop = args.drop_every_th and index % args.drop_every_th == args.drop_every_th - 1
    sent = time.monotonic()
    try:
        async with client.stream("POST", route, json=body) as response:
            header_seconds.setdefault(response.status_code, []).append(time.monotonic() - sent)
            if response.status_code != 200:
                await response.aread()
                outcomes[str(response.status_code)] += 1
                return
            chunks, done, error = 0, False, False
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                chunks += 1
                done = line.strip() == "data: [DONE]"
                error = error or '"error"' in line
                if drop and chunks >= 2:
                    outcomes["200 dropped by the client"] += 1
                    return
            outcomes["200" if done and not error else "lost: stream cut or error event"] += 1
    except httpx.HTTPError as failure:
        outcomes[f"lost: {type(failure).__name__}"] += 1


async def run_load(base_url: str, model: str, args) -> tuple[collections.Counter, dict]:
    outcomes: collections.Counter = collections.Counter()
    header_seconds: dict[int, list[float]] = {}
    gate = asyncio.Semaphore(args.concurrency)
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, timeout=IDLE_TIMEOUT_S, limits=limits) as client:
        async def gated(index):
            async with gate:
                await one_request(client, index, args, model, outcomes, header_seconds)
        await asyncio.gather(*(gated(index) for index in range(args.requests)))
    return outcomes, header_seconds


def wait_idle(server: ServeProcess) -> dict:
    """Metrics once nothing is admitted (or after IDLE_TIMEOUT_S)."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        samples = server.metrics()
        idle = metric(samples, "specwise:num_requests_admitted") == 0 and \
            metric(samples, "specwise:kv_cache_blocks_used") == 0
        if idle or time.monotonic() > deadline:
            return samples
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--drop-every-th", type=int, default=8, help="every n-th client hangs up mid-stream")
    parser.add_argument("--diagnose", action="store_true", help="run the server under loop_stalls.py")
    parser.add_argument("--switch-interval", type=float, default=None, help="with --diagnose: the server's "
                        "sys.setswitchinterval (an experiment; Python's default is 0.005)")
    parser.add_argument("--out", type=Path, default=None, help="directory for the server log and results.json")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="whose specwise/ the server runs (default: this "
                        "one; `git archive COMMIT specwise | tar -x -C DIR` for a before/after)")
    parser.add_argument("flags", nargs="*", help="specwise serve flags (after --)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="specwise-overload-"))
    launcher = [sys.executable, str(Path(__file__).with_name("loop_stalls.py"))] if args.diagnose else None
    if args.switch_interval is not None:
        if not args.diagnose:
            parser.error("--switch-interval needs --diagnose (loop_stalls.py sets it)")
        os.environ["LOOP_STALLS_SWITCH_INTERVAL"] = str(args.switch_interval)
    print(f"overload: {args.requests} streaming requests at concurrency {args.concurrency}, max_tokens "
          f"{args.max_tokens}, 1 in {args.drop_every_th} clients dropping; serve {' '.join(args.flags)} from "
          f"{args.checkout}{'' if args.switch_interval is None else f', switch interval {args.switch_interval}'}; "
          f"log {out / 'server.log'}", flush=True)
    with ServeProcess(args.flags, out / "server.log", launcher=launcher, checkout=args.checkout) as server:
        model = httpx.get(server.url("/v1/models"), timeout=30).json()["data"][0]["id"]
        rss_before = server.rss_mb()
        print(f"load average before: {load_average()}", flush=True)
        started, load_began = time.monotonic(), time.time()
        with Probes(server.port, model) as probes:
            outcomes, header_seconds = asyncio.run(run_load(server.url(""), model, args))
            wall = time.monotonic() - started
            load_during = load_average()
        end = wait_idle(server)
        rss_after = server.rss_mb()
    results = {"wall_s": wall, "load_average_at_end_of_load": load_during, "outcomes": dict(outcomes),
               "lost": sum(n for outcome, n in outcomes.items() if outcome.startswith("lost")),
               "unanswered": args.requests - sum(outcomes.values()),
               "probes": {endpoint: latency_summary(records, 429 if endpoint == "admission" else None)
                          for endpoint, records in probes.records.items()},
               "admission_probe_statuses": dict(collections.Counter(s for _, _, s in probes.records["admission"])),
               "client_seconds_to_headers": {status: latency_summary([(0, s, status) for s in seconds])
                                             for status, seconds in header_seconds.items()},
               "slowest_health_probes": [{"at_s": round(at - load_began, 1), "ms": round(seconds * 1000, 1)} for
                                         at, seconds, _ in sorted(probes.records["/health"], key=lambda r: -r[1])[:5]],
               "kv_blocks_used_at_end": metric(end, "specwise:kv_cache_blocks_used"),
               "admitted_at_end": metric(end, "specwise:num_requests_admitted"),
               "rss_mb": [rss_before, rss_after], "server_exit_status": server.exit_status}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"load: {wall:.1f} s wall; load average at its end {load_during}")
    for endpoint, summary in results["probes"].items():
        if summary["n"]:
            print(f"  {endpoint:12s} n={summary['n']:4d}  p50 {summary['p50_ms']:8.1f} ms  p99 "
                  f"{summary['p99_ms']:8.1f} ms  max {summary['max_ms']:8.1f} ms  no answer {summary['failed']}")
    print(f"  admission probe statuses: {results['admission_probe_statuses']} (latency above: its 429s; 0: "
          f"admitted, then no token within {PROBE_TIMEOUT_S:.0f} s behind the queue)")
    slowest = ", ".join(f"{probe['ms']} ms at {probe['at_s']} s" for probe in results["slowest_health_probes"])
    print(f"  slowest /health probes (time from the load's start): {slowest}")
    print(f"  outcomes: {dict(outcomes)}; lost {results['lost']}; never finished {results['unanswered']}")
    for status, summary in results["client_seconds_to_headers"].items():
        print(f"  client's own time to a {status}: p50 {summary['p50_ms']:.1f} ms  p99 {summary['p99_ms']:.1f} ms  "
              f"max {summary['max_ms']:.1f} ms (n={summary['n']})")
    print(f"  at the end: KV blocks in use {results['kv_blocks_used_at_end']:.0f}, admitted "
          f"{results['admitted_at_end']:.0f}; RSS {rss_before:.0f} -> {rss_after:.0f} MiB; "
          f"server exit status {server.exit_status}")
    if args.diagnose:
        tail = [line for line in (out / "server.log").read_text().splitlines() if line.startswith("loop-watch")]
        print("\n".join(tail[-13:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
