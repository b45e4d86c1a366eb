"""Does `specwise serve` slow down as it serves? A loaded server against its idle twin, on one core.

    python benchmarks/loaded_twin.py                       # 4 loads of 60 s, 64 clients
    python benchmarks/loaded_twin.py --loads 8 --load-s 120 -- --speculative ngram

Starts two identical servers (eager, one thread, both pinned to core 0, the client free to use the
other) and measures each one's batch-1 decode step in turn: three requests one after another (64 tokens
after a 20-word prompt, greedy, ignore_eos), the median of the steps the server says it ran with one
sequence fed one row (GET /steps). Then `--loads` times: server A alone serves --load-s seconds of
--clients concurrent clients (prompts of 60-180 words, 48 tokens out), and both are measured again, A, B,
A, B. A drift of the machine moves both; a server that slows with what it has served moves A alone, so
the column to read is A/B. Both servers are ended by PID (SIGTERM to their process groups, then SIGKILL)
whatever happens. Results: docs/calculators.md, "Limits, in plain words".
"""

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

PROMPT = "The quick brown fox jumps over the lazy dog while the cat watches from the window and thinks about"
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega").split()


def get(port: int, path: str) -> dict:
    return json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=600))


def complete(port: int, body: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(request, timeout=600))


def batch1_step_ms(port: int, model: str, requests: int = 3) -> float:
    """The median batch-1 decode step (one sequence, one row) over `requests` requests one after another."""
    first = get(port, "/steps?after=0&limit=0")["next"]
    for _ in range(requests):
        complete(port, {"model": model, "prompt": PROMPT, "max_tokens": 64, "ignore_eos": True, "temperature": 0})
    steps = get(port, f"/steps?after={first}")["steps"]
    return 1000 * statistics.median(s["seconds"] for s in steps if s["fed"] == [1])


def load(port: int, model: str, seconds: float, clients: int, seed: int) -> int:
    """`clients` closed-loop clients for `seconds`; the requests they completed."""
    stop, done, lock = time.monotonic() + seconds, [0], threading.Lock()

    def client(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        while time.monotonic() < stop:
            prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 180)))
            complete(port, {"model": model, "prompt": prompt, "max_tokens": 48, "ignore_eos": True,
                            "temperature": 0})
            with lock:
                done[0] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return done[0]


def rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loads", type=int, default=4)
    parser.add_argument("--load-s", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--ports", default="8101,8102")
    parser.add_argument("serve_args", nargs="*", help="more `specwise serve` flags, after --")
    args = parser.parse_args()
    ports = dict(zip("AB", map(int, args.ports.split(","))))
    servers: dict[str, subprocess.Popen] = {}
    try:
        for name, port in ports.items():
            servers[name] = subprocess.Popen(
                ["taskset", "-c", "0", sys.executable, "-m", "specwise", "serve", "--port", str(port),
                 "--num-threads", "1", "--no-compile", *args.serve_args],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        model = ""
        for port in ports.values():
            for _ in range(600):
                try:
                    model = get(port, "/v1/models")["data"][0]["id"]
                    break
                except OSError:
                    time.sleep(1)
            else:
                sys.exit(f"the server on port {port} never answered")

        def measure(label: str) -> None:
            steps = {"A": [], "B": []}
            for _ in range(2):
                for name in "AB":
                    steps[name].append(batch1_step_ms(ports[name], model))
            a, b = statistics.mean(steps["A"]), statistics.mean(steps["B"])
            print(f"{time.strftime('%H:%M:%S')}  {label:<16} A {a:6.1f} ms  B {b:6.1f} ms  A/B {a / b:.3f}  "
                  f"RSS A {rss_mb(servers['A'].pid)} MB, B {rss_mb(servers['B'].pid)} MB", flush=True)

        print("batch-1 decode step, each the mean of two medians; A serves the loads, B idles")
        measure("fresh")
        for index in range(args.loads):
            served = load(ports["A"], model, args.load_s, args.clients, index)
            measure(f"after load {index + 1} ({served})")
    finally:
        for server in servers.values():
            try:
                os.killpg(server.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for server in servers.values():
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


if __name__ == "__main__":
    main()
