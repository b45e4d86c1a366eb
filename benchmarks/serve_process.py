"""A `specwise serve` process for the server benchmarks (overload.py, soak.py): started in its own
session on 127.0.0.1, ready when it answers GET /health, measured by PID, and stopped by its process
group (SIGTERM, then SIGKILL after a grace) however the benchmark ends: the launcher's own
LaunchedServer (bench/launch/server.py), which `evaluate --engine` starts vLLM and SGLang with.

    with ServeProcess(["--speculative", "suffix"], log_path) as server:
        server.url("/v1/completions"), server.rss_mb(), server.metrics()
"""

import sys
from pathlib import Path

import httpx

from specwise.bench.launch.command import ServerCommand, free_port
from specwise.bench.launch.server import LaunchedServer
from specwise.bench.load.targets.prometheus import parse_exposition

ROOT = Path(__file__).resolve().parents[1]       # the server runs this checkout's specwise
START_TIMEOUT_S = 900.0        # a first compiled start on the 2-core VM takes minutes
STOP_GRACE_S = 60.0            # SIGTERM drains in-flight requests (--shutdown-timeout)


class ServeProcess:
    def __init__(self, flags: list[str], log_path: Path, port: int | None = None, launcher: list[str] | None = None,
                 checkout: Path = ROOT):
        """launcher: what runs `specwise serve FLAGS` (loop_stalls.py runs it with a stall watcher); checkout: the
        directory whose specwise/ the server imports (another commit's, `git archive`d, for a before/after)."""
        self.port = port or free_port()
        # -P: no working directory on the path, so PYTHONPATH's checkout is the specwise imported
        launcher = launcher or [sys.executable, "-P", "-m", "specwise", "serve"]
        self.server = LaunchedServer(ServerCommand("serve", [*launcher, "--host", "127.0.0.1", "--port", str(self.port),
                                                            *flags], self.port,
                                                   {"PYTHONPATH": str(Path(checkout).resolve())}), log_path)
        self.pid: int | None = None
        self.exit_status: int | None = None

    def url(self, path: str) -> str:
        return self.server.command.url + path

    def __enter__(self) -> "ServeProcess":
        self.server.start_and_wait(START_TIMEOUT_S)
        self.pid = self.server.process.pid
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM the server (it drains and exits 0), SIGKILL its group if it outlives the grace."""
        if self.server.process is not None:
            self.exit_status = self.server.stop(STOP_GRACE_S)

    def rss_mb(self) -> float:
        """Resident memory of the server process, MiB (from /proc: no psutil needed)."""
        with open(f"/proc/{self.pid}/status") as status:
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
