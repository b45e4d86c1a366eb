"""Does `specwise serve` slow down as it serves? A loaded server against its idle twin, on one core.

    python benchmarks/loaded_twin.py                       # 4 loads of 60 s, 64 clients
    python benchmarks/loaded_twin.py --loads 8 --load-s 120 -- --speculative ngram

Starts two identical servers (eager, one thread, both pinned to core 0, the client free to use the
other) and measures each one's batch-1 decode step in turn: three requests one after another (64 tokens
after a 20-word prompt, greedy, ignore_eos), the median of the steps the server says it ran with one
sequence fed one row (GET /steps). Then `--loads` times: server A alone serves --load-s seconds of
--clients concurrent clients (prompts of 60-180 words, 48 tokens out), and both are measured again, A, B,
A, B. A drift of the machine moves both; a server that slows with what it has served moves A alone, so
the column to read is A/B. Both servers are serve_process.py's: ended by their process groups (SIGTERM,
then SIGKILL) whatever happens. Results: docs/calculators.md, "Limits, in plain words".
"""

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from serve_process import ServeProcess

PROMPT = "The quick brown fox jumps over the lazy dog while the cat watches from the window and thinks about"
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega").split()
# both servers on core 0, the client free to use the other
LAUNCHER = ["taskset", "-c", "0", sys.executable, "-P", "-m", "specwise", "serve"]


def complete(server: ServeProcess, prompt: str, max_tokens: int) -> None:
    httpx.post(server.url("/v1/completions"), timeout=600, json={
        "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}).raise_for_status()


def batch1_step_ms(server: ServeProcess, requests: int = 3) -> float:
    """The median batch-1 decode step (one sequence, one row) over `requests` requests one after another."""
    first = httpx.get(server.url("/steps?after=0&limit=0"), timeout=60).json()["next"]
    for _ in range(requests):
        complete(server, PROMPT, 64)
    steps = httpx.get(server.url(f"/steps?after={first}"), timeout=60).json()["steps"]
    return 1000 * statistics.median(s["seconds"] for s in steps if s["fed"] == [1])


def load(server: ServeProcess, seconds: float, clients: int, seed: int) -> int:
    """`clients` closed-loop clients for `seconds`; the requests they completed."""
    stop, done, lock = time.monotonic() + seconds, [0], threading.Lock()

    def client(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        while time.monotonic() < stop:
            complete(server, " ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 180))), 48)
            with lock:
                done[0] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return done[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loads", type=int, default=4)
    parser.add_argument("--load-s", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--logs", type=Path, default=None, help="the servers' logs (default: a new temporary folder)")
    parser.add_argument("serve_args", nargs="*", help="more `specwise serve` flags, after --")
    args = parser.parse_args()
    logs = args.logs or Path(tempfile.mkdtemp(prefix="loaded-twin-"))
    logs.mkdir(parents=True, exist_ok=True)
    flags = ["--num-threads", "1", "--no-compile", *args.serve_args]
    with ExitStack() as stack:
        a, b = (stack.enter_context(ServeProcess(flags, logs / f"{name}.log", launcher=LAUNCHER)) for name in "AB")

        def measure(label: str) -> None:
            steps = {a: [], b: []}
            for _ in range(2):
                for server in (a, b):
                    steps[server].append(batch1_step_ms(server))
            step_a, step_b = statistics.mean(steps[a]), statistics.mean(steps[b])
            print(f"{time.strftime('%H:%M:%S')}  {label:<16} A {step_a:6.1f} ms  B {step_b:6.1f} ms  "
                  f"A/B {step_a / step_b:.3f}  RSS A {a.rss_mb():.0f} MB, B {b.rss_mb():.0f} MB", flush=True)

        print(f"batch-1 decode step, each the mean of two medians; A serves the loads, B idles (logs: {logs})")
        measure("fresh")
        for index in range(args.loads):
            served = load(a, args.load_s, args.clients, index)
            measure(f"after load {index + 1} ({served})")


if __name__ == "__main__":
    main()
