"""vLLM for CPU as a child process on 127.0.0.1, for the export integration test and
benchmarks/vllm_eagle_check.py: started in its own session (its PID is its process group, which
holds the engine core and workers it forks), waited on until /health answers or it exits, and
stopped by that group's PID, even on failure.

    with VllmServer(model_dir, ["--speculative-config", spec]) as server:
        text = server.complete(messages, max_tokens=32)
"""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

VLLM_VENV = Path(os.environ.get("SPECWISE_VLLM_VENV",
                                Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specwise/vllm-venv"))
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
START_TIMEOUT = float(os.environ.get("START_TIMEOUT", 1200))        # the first start compiles for minutes
SERVED_NAME = "target"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class VllmServer:
    def __init__(self, model: str | Path, extra_args: list[str], log: Path, dtype: str = "float32",
                 max_model_len: int = 2048, kv_cache_gb: int = 1):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(log)
        self.command = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                        "--served-model-name", SERVED_NAME, "--dtype", dtype, "--max-model-len", str(max_model_len),
                        "--max-num-seqs", "8", "--no-enable-prefix-caching", "--host", "127.0.0.1",
                        "--port", str(self.port), *extra_args]
        self.env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gb)}
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "VllmServer":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as stream:
            self.process = subprocess.Popen(self.command, stdout=stream, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log.read_text()[-2000:]
                raise RuntimeError(f"vLLM exited with {self.process.returncode} before answering; log tail:\n{tail}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(2)                                   # polling a child that compiles; no timing assumed
        raise RuntimeError(f"vLLM not healthy after {START_TIMEOUT:.0f} s (log: {self.log})")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def post(self, path: str, body: dict, timeout: float = 600) -> dict:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def complete(self, messages: list[dict], max_tokens: int) -> str:
        """Greedy chat completion: its text."""
        answer = self.post("/v1/chat/completions", {"model": SERVED_NAME, "messages": messages, "temperature": 0,
                                                    "max_tokens": max_tokens})
        return answer["choices"][0]["message"]["content"]

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as response:
            return response.read().decode()
