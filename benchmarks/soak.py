"""Can `specwise serve` be left running? An hour of mixed traffic, watched each minute.

    python benchmarks/soak.py --arm suffix --minutes 60 --out /tmp/soak-suffix -- --no-compile
    python benchmarks/soak.py --arm ngram-structured --minutes 60 --out /tmp/soak-ngram
    python benchmarks/soak.py --minutes 3 --out /tmp/soak-check          # a quick check of the script

Starts `specwise serve` with the arm's drafter (suffix; or ngram with mostly structured output) and
`--max-num-seqs 16 --max-queue 16` (flags after -- are added), on loopback, by PID; ends it by PID
(SIGTERM, then SIGKILL) whatever happens. Traffic (soak_traffic.py), all of it bounded:
  - --concurrency steady clients, each sending one request after another from the arm's mix (streams
    and whole answers, n = 2, JSON schemas, forced tool calls, clients hanging up mid-stream), waiting
    Retry-After after a 429;
  - every --malformed-every-s a malformed request (must be a 4xx);
  - every --kill-every-s a client process started on a stream and SIGKILLed by PID mid-stream;
  - every --burst-every-min minutes (first at half that; once mid-run when shorter) a burst of
    max_num_seqs + max_queue + 16 requests of 8 tokens at once, past the queue bound (429s expected);
  - every --idle-every-min minutes (and at the end) the traffic pauses until nothing is admitted: the
    KV blocks in use must then be 0.
Each minute a row: load average (the machine is shared: read it beside the latencies), server RSS, KV
blocks in use, requests admitted, suffix-cache tokens, grammars cached, that minute's requests by
outcome, the steady clients' stream TTFT / TPOT p50 and p99. Written to OUT/soak.csv and soak.json
(with the targets checked: soak_report.py) and plotted to OUT/soak.png. --diagnose-memory runs the server
under memory_watch.py: its log then has the allocator's books each minute (where RSS growth sits).
"""

import argparse
import asyncio
import collections
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx
import soak_report
import soak_traffic
from serve_process import ServeProcess, load_average, metric

REQUEST_TIMEOUT_S = 300.0
IDLE_DEADLINE_S = 300.0


class Soak:
    def __init__(self, args, server: ServeProcess, model: str):
        self.args, self.server, self.model = args, server, model
        self.started = time.monotonic()
        self.outcomes: list[tuple[float, str]] = []            # (minute as a float, outcome)
        self.streams: list[tuple[float, float, float]] = []    # steady streams: (minute, ttft s, tpot s)
        self.idle_checks: list[dict] = []
        self.rows: list[dict] = []
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.stop = asyncio.Event()

    def minute(self) -> float:
        return (time.monotonic() - self.started) / 60

    def note(self, outcome: str) -> None:
        self.outcomes.append((self.minute(), outcome))

    async def send(self, client: httpx.AsyncClient, kind: str, rng: random.Random, steady: bool) -> None:
        route, body, read = soak_traffic.request(kind, rng, self.model)
        sent = time.monotonic()
        try:
            async with client.stream("POST", route, json=body, timeout=REQUEST_TIMEOUT_S) as response:
                if response.status_code != 200:
                    await response.aread()
                    self.note(status_class(response.status_code))
                    if steady and response.status_code == 429:        # as a client should: wait Retry-After
                        await asyncio.sleep(float(response.headers.get("retry-after", "1")))
                    return
                if read == "whole":
                    await response.aread()
                    self.note("200")
                    return
                first, tokens, done, chunks = None, None, False, 0
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    chunks += 1
                    if read == "hang-up" and chunks >= 3:
                        self.note("hung up")
                        return
                    if line.strip() == "data: [DONE]":
                        done = True
                    elif '"error"' in line:
                        self.note("5xx: error event")
                        return
                    elif first is None:
                        first = time.monotonic()
                    if '"usage"' in line and '"completion_tokens"' in line:
                        tokens = json_usage(line)
                end = time.monotonic()
                self.note("200" if done else "lost: stream cut")
                if done and steady and first is not None and tokens and tokens > 1:
                    self.streams.append((self.minute(), first - sent, (end - first) / (tokens - 1)))
        except httpx.HTTPError as error:
            self.note(f"lost: {type(error).__name__}")

    async def steady_client(self, index: int) -> None:
        rng = random.Random(self.args.seed * 1000 + index)
        mix = soak_traffic.MIXES[self.args.arm]
        kinds, weights = list(mix), list(mix.values())
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=self.server.url(""), limits=limits) as client:
            while not self.stop.is_set():
                await self.flowing.wait()
                await self.send(client, rng.choices(kinds, weights)[0], rng, steady=True)

    async def every(self, period_s: float, action) -> None:
        while not self.stop.is_set():
            try:
                await asyncio.wait_for(self.stop.wait(), period_s)
            except asyncio.TimeoutError:
                await self.flowing.wait()
                await action()

    async def malformed(self, client: httpx.AsyncClient, rng: random.Random) -> None:
        route, body = soak_traffic.malformed(rng, self.model)
        try:
            response = await client.post(route, content=body, headers={"Content-Type": "application/json"},
                                         timeout=REQUEST_TIMEOUT_S)
            self.note(status_class(response.status_code))
        except httpx.HTTPError as error:
            self.note(f"lost: {type(error).__name__}")

    async def killed_client(self) -> None:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", soak_traffic.KILLED_CLIENT, str(self.server.port), self.model,
            stdout=asyncio.subprocess.PIPE)
        try:
            line = await asyncio.wait_for(process.stdout.readline(), REQUEST_TIMEOUT_S)
            status = line.decode().strip()
            self.note("killed" if status == "200" else status_class(int(status)) if status.isdigit() else "lost: "
                      "killed client got no status")
        finally:
            if process.returncode is None:
                process.kill()             # SIGKILL to its PID, mid-stream
            await process.wait()

    async def burst(self) -> None:
        size = self.args.max_num_seqs + self.args.max_queue + 16
        limits = httpx.Limits(max_connections=size, max_keepalive_connections=0)
        rng = random.Random(self.args.seed)
        async with httpx.AsyncClient(base_url=self.server.url(""), limits=limits) as client:
            await asyncio.gather(*(self.send(client, "short", rng, steady=False) for _ in range(size)))

    async def idle_check(self) -> None:
        """Pause the traffic until nothing is admitted; record the KV blocks then in use."""
        self.flowing.clear()
        try:
            deadline = time.monotonic() + IDLE_DEADLINE_S
            while True:
                samples = await asyncio.to_thread(self.server.metrics)
                admitted = metric(samples, "specwise:num_requests_admitted")
                if admitted == 0 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            self.idle_checks.append({"minute": round(self.minute(), 2), "admitted": admitted,
                                     "kv_blocks_used": metric(samples, "specwise:kv_cache_blocks_used")})
        finally:
            self.flowing.set()

    async def scheduled(self, at_minutes: list[float], action) -> None:
        for at in at_minutes:
            delay = at * 60 - (time.monotonic() - self.started)
            try:
                await asyncio.wait_for(self.stop.wait(), max(0.0, delay))
                return
            except asyncio.TimeoutError:
                await action()

    async def minute_rows(self) -> None:
        for minute in range(1, self.args.minutes + 1):
            delay = minute * 60 - (time.monotonic() - self.started)
            await asyncio.sleep(max(0.0, delay))
            self.rows.append(await asyncio.to_thread(self.row, minute))
            row = self.rows[-1]
            print(f"minute {minute:3d}: load {row['load_average']}, RSS {row['rss_mb']:.0f} MiB, KV "
                  f"{row['kv_blocks_used']:.0f}, 200 {row['n_200']}, 429 {row['n_429']}, 4xx {row['n_4xx']}, 5xx "
                  f"{row['n_5xx']}, lost {row['n_lost']}, TTFT p99 {row['ttft_p99_ms']} ms, TPOT p99 "
                  f"{row['tpot_p99_ms']} ms", flush=True)
        self.stop.set()

    def row(self, minute: int) -> dict:
        samples = self.server.metrics()
        counts = collections.Counter(outcome_column(outcome) for at, outcome in self.outcomes
                                     if minute - 1 <= at < minute)
        ttft = [s[1] for s in self.streams if minute - 1 <= s[0] < minute]
        tpot = [s[2] for s in self.streams if minute - 1 <= s[0] < minute]
        return {"minute": minute, "load_average": load_average(), "rss_mb": round(self.server.rss_mb(), 1),
                "kv_blocks_used": metric(samples, "specwise:kv_cache_blocks_used"),
                "admitted": metric(samples, "specwise:num_requests_admitted"),
                "suffix_cache_tokens": metric(samples, "specwise:spec_decode_cache_tokens"),
                "grammars_cached": metric(samples, "specwise:structured_output_grammars_cached"),
                **{f"n_{name}": counts[name] for name in ("200", "hung_up", "429", "4xx", "5xx", "killed", "lost")},
                "steady_streams": len(ttft),
                "ttft_p50_ms": rounded(soak_report.percentile_ms(ttft, 50)),
                "ttft_p99_ms": rounded(soak_report.percentile_ms(ttft, 99)),
                "tpot_p50_ms": rounded(soak_report.percentile_ms(tpot, 50)),
                "tpot_p99_ms": rounded(soak_report.percentile_ms(tpot, 99))}

    async def run(self) -> None:
        args = self.args
        rng = random.Random(args.seed)
        minutes = args.minutes
        bursts = [b for b in frange(args.burst_every_min / 2, minutes, args.burst_every_min)] or [minutes / 2]
        idles = [i - 0.5 for i in frange(args.idle_every_min, minutes, args.idle_every_min)] or [minutes / 2]
        async with httpx.AsyncClient(base_url=self.server.url("")) as client:
            tasks = [asyncio.ensure_future(self.steady_client(index)) for index in range(args.concurrency)]
            tasks += [asyncio.ensure_future(self.every(args.malformed_every_s, lambda: self.malformed(client, rng))),
                      asyncio.ensure_future(self.every(args.kill_every_s, self.killed_client)),
                      asyncio.ensure_future(self.scheduled(bursts, self.burst)),
                      asyncio.ensure_future(self.scheduled(idles, self.idle_check))]
            await self.minute_rows()
            await asyncio.gather(*tasks)
        await self.idle_check()              # the end: everything answered, the cache empty


def status_class(status: int) -> str:
    return "429" if status == 429 else f"4xx: {status}" if 400 <= status < 500 else f"5xx: {status}" \
        if status >= 500 else str(status)


def outcome_column(outcome: str) -> str:
    if outcome.startswith(("4xx", "5xx", "lost")):
        return outcome[:outcome.index(":")] if ":" in outcome else outcome
    return {"hung up": "hung_up"}.get(outcome, outcome)


def json_usage(line: str) -> int | None:
    payload = json.loads(line[5:])
    return (payload.get("usage") or {}).get("completion_tokens")


def frange(start: float, stop: float, step: float) -> list[float]:
    values, value = [], start
    while value < stop:
        values.append(value)
        value += step
    return values


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", choices=sorted(soak_traffic.MIXES), default="suffix")
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=4, help="steady clients")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-queue", type=int, default=16)
    parser.add_argument("--malformed-every-s", type=float, default=5.0)
    parser.add_argument("--kill-every-s", type=float, default=20.0)
    parser.add_argument("--burst-every-min", type=float, default=5.0)
    parser.add_argument("--idle-every-min", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--diagnose-memory", action="store_true", help="run the server under memory_watch.py "
                        "(its log: the allocator's books each minute; MEMORY_WATCH_TRIM, MEMORY_WATCH_TRACEMALLOC)")
    parser.add_argument("flags", nargs="*", help="more specwise serve flags (after --)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix=f"specwise-soak-{args.arm}-"))
    out.mkdir(parents=True, exist_ok=True)
    flags = [*soak_traffic.ARM_FLAGS[args.arm], "--max-num-seqs", str(args.max_num_seqs), "--max-queue",
             str(args.max_queue), *args.flags]
    print(f"soak: arm {args.arm}, {args.minutes} min, serve {' '.join(flags)}; out {out}", flush=True)
    launcher = [sys.executable, str(Path(__file__).with_name("memory_watch.py"))] if args.diagnose_memory else None
    with ServeProcess(flags, out / "server.log", launcher=launcher) as server:
        model = httpx.get(server.url("/v1/models"), timeout=30).json()["data"][0]["id"]
        soak = Soak(args, server, model)
        asyncio.run(soak.run())
    lost = sum(1 for _, outcome in soak.outcomes if outcome.startswith("lost"))
    summary = {"arm": args.arm, "serve_flags": flags, "server_exit_status": server.exit_status,
               "outcomes": dict(collections.Counter(outcome for _, outcome in soak.outcomes)),
               "checks": soak_report.checks(soak.rows, soak.streams, soak.idle_checks, args.minutes, lost)}
    soak_report.write(out, soak.rows, summary)
    plotted = soak_report.plot(out, soak.rows, f"specwise serve {' '.join(flags)}: {args.minutes} min soak")
    checks = summary["checks"]
    print(f"outcomes: {summary['outcomes']}")
    print(f"RSS: {checks['rss_at_reference_mb']} MiB at minute {checks['rss_reference_minute']}, at most "
          f"{checks['rss_max_after_mb']} after: growth {checks['rss_growth']:.1%} (<= 5%: {checks['rss_ok']})")
    print(f"KV 0 at every idle check: {checks['kv_zero_when_idle']} ({checks['idle_checks']})")
    print(f"TTFT p99 first/last {checks['latency_window_minutes']} min: {checks['ttft_p99_first_ms']} / "
          f"{checks['ttft_p99_last_ms']} ms; TPOT p99 {checks['tpot_p99_first_ms']} / {checks['tpot_p99_last_ms']} ms "
          f"(ratios {checks['ttft_p99_ratio']}, {checks['tpot_p99_ratio']}; within 10%: {checks['latency_ok']})")
    print(f"requests without a status: {lost}; server exit status {server.exit_status}; {plotted}; {out / 'soak.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
