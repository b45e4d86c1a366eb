"""A `specwise serve` process for the server benchmarks (overload.py, soak.py): started in its own
session on 127.0.0.1, ready when GET /health answers 200, measured by PID, and stopped by PID
(SIGTERM, then SIGKILL to its group after a grace) however the benchmark ends.

    with ServeProcess(["--speculative", "suffix"], log_path) as server:
        server.url("/v1/completions"), server.rss_mb(), server.metrics()
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from specwise.bench.launch.server import process_alive
from specwise.bench.load.targets.prometheus import parse_exposition

ROOT = Path(__file__).resolve().parents[1]       # the server runs this checkout's specwise
START_TIMEOUT_S = 900.0        # a first compiled start on the 2-core VM takes minutes
STOP_GRACE_S = 60.0            # SIGTERM drains in-flight requests (--shutdown-timeout)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServeProcess:
    def __init__(self, flags: list[str], log_path: Path, port: int | None = None, launcher: list[str] | None = None,
                 checkout: Path = ROOT):
        """launcher: what runs `specwise serve FLAGS` (loop_stalls.py runs it with a stall watcher); checkout: the
        directory whose specwise/ the server imports (another commit's, `git archive`d, for a before/after)."""
        self.port = port or free_port()
        self.checkout = Path(checkout).resolve()
        launcher = launcher or [sys.executable, "-m", "specwise", "serve"]
        self.command = [*launcher, "--host", "127.0.0.1", "--port", str(self.port), *flags]
        self.log_path = Path(log_path)
        self.process: subprocess.Popen | None = None
        self.exit_status: int | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> "ServeProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            env = dict(os.environ, PYTHONPATH=str(self.checkout))
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                            cwd=self.checkout, env=env)
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"specwise serve exited with status {self.process.returncode}; see {self.log_path}")
            try:
                if httpx.get(self.url("/health"), timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise RuntimeError(f"specwise serve was not ready after {START_TIMEOUT_S:.0f} s; see {self.log_path}")

    def stop(self) -> None:
        """SIGTERM the server (it drains and exits 0), SIGKILL its group if it outlives the grace."""
        if self.process is None or self.exit_status is not None:
            return
        pid = self.process.pid
        if self.process.poll() is None:
            os.kill(pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        if process_alive(pid) or self.process.poll() is None:
            os.killpg(pid, signal.SIGKILL)
            self.process.wait()
        self.exit_status = self.process.returncode

    def rss_mb(self) -> float:
        """Resident memory of the server process, MiB (from /proc: no psutil needed)."""
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def metrics(self, timeout: float = 30) -> dict[tuple, float]:
        """{(name, frozenset(labels)): value} from GET /metrics."""
        text = httpx.get(self.url("/metrics"), timeout=timeout).text
        return {(name, frozenset(labels.items())): value for name, labels, value in parse_exposition(text)}


def metric(samples: dict, name: str, **labels) -> float:
    return samples.get((name, frozenset((k, str(v)) for k, v in labels.items())), 0.0)


def load_average() -> str:
    with open("/proc/loadavg") as file:
        return " ".join(file.read().split()[:3])
