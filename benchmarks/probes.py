"""Liveness probes for the server benchmarks (overload.py, soak.py), from their own process.

One thread per endpoint sends a GET every PERIOD_S on a fresh connection (as a Kubernetes probe
does) and records (sent at, seconds to the whole answer, status); a probe that gets no answer in
PROBE_TIMEOUT_S is recorded with that many seconds and status 0. The "admission" probe POSTs a
one-token completion: while the queue is full its answer is the 429, so its latency is admission's.
The probes run in a spawned process so that the load generator's own event loop, however busy,
never delays them: what they measure is the server.
"""

import http.client
import json
import multiprocessing
import threading
import time

import numpy as np

PERIOD_S = 0.5
PROBE_TIMEOUT_S = 30.0
ENDPOINTS = ("/health", "/metrics", "/v1/models", "admission")


def probe_once(port: int, endpoint: str, body: bytes) -> int:
    """One request on a new connection (http.client: no client set-up to time, unlike httpx's TLS context)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT_S)
    try:
        if endpoint == "admission":
            connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        else:
            connection.request("GET", endpoint)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def probe_one(port: int, endpoint: str, model: str, stop, records: list) -> None:
    body = json.dumps({"model": model, "prompt": "Hi", "max_tokens": 1}).encode()
    while not stop.is_set():
        sent = time.monotonic()
        try:
            status = probe_once(port, endpoint, body)
        except (OSError, http.client.HTTPException):
            status = 0
        elapsed = time.monotonic() - sent
        records.append((time.time() - elapsed, elapsed, status))
        stop.wait(max(0.0, PERIOD_S - elapsed))


def run_probes(port: int, model: str, stop, results) -> None:
    """Process body: probe every endpoint until `stop` is set, then put {endpoint: records} on `results`."""
    local_stop = threading.Event()
    records = {endpoint: [] for endpoint in ENDPOINTS}
    threads = [threading.Thread(target=probe_one, args=(port, endpoint, model, local_stop, records[endpoint]))
               for endpoint in ENDPOINTS]
    for thread in threads:
        thread.start()
    stop.wait()
    local_stop.set()
    for thread in threads:
        thread.join()
    results.put(records)


class Probes:
    """with Probes(port, model) as probes: ...; then probes.records {endpoint: [(t, seconds, status)]}."""

    def __init__(self, port: int, model: str):
        context = multiprocessing.get_context("spawn")
        self.stop, self.results = context.Event(), context.Queue()
        self.process = context.Process(target=run_probes, args=(port, model, self.stop, self.results), daemon=True)
        self.records: dict[str, list] = {}

    def __enter__(self) -> "Probes":
        self.process.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        try:
            self.records = self.results.get(timeout=PROBE_TIMEOUT_S + 10)
        finally:
            self.process.join(timeout=5)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()


def latency_summary(records: list, only_status: int | None = None) -> dict:
    """p50 / p99 / max in ms over the records (those with `only_status`, if given), and their count."""
    seconds = [s for _, s, status in records if only_status is None or status == only_status]
    if not seconds:
        return {"n": 0}
    ms = np.array(seconds) * 1000
    return {"n": len(ms), "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "max_ms": float(ms.max()), "failed": sum(1 for _, _, status in records if status == 0)}
