"""vLLM for CPU as a child process on 127.0.0.1, for the export integration test and
benchmarks/vllm_eagle_check.py: the launcher's own LaunchedServer (bench/launch/server.py), as
`evaluate --engine vllm` starts it: its own session (its PID is its process group, which holds the
engine core and workers it forks), waited on until /health answers or it exits (the engine's own
complaint in the error), and stopped by that group's PID, even on failure.

    with VllmServer(model_dir, ["--speculative-config", spec]) as server:
        text = server.complete(messages, max_tokens=32)
"""

import json
import os
import urllib.request
from pathlib import Path

from specwise.bench.launch.command import ServerCommand, free_port
from specwise.bench.launch.server import LaunchedServer

VLLM_VENV = Path(os.environ.get("SPECWISE_VLLM_VENV",
                                Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specwise/vllm-venv"))
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
START_TIMEOUT = float(os.environ.get("START_TIMEOUT", 1200))        # the first start compiles for minutes
STOP_GRACE = 60.0
SERVED_NAME = "target"


class VllmServer:
    def __init__(self, model: str | Path, extra_args: list[str], log: Path, dtype: str = "float32",
                 max_model_len: int = 2048, kv_cache_gb: int = 1):
        port = free_port()
        command = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                   "--served-model-name", SERVED_NAME, "--dtype", dtype, "--max-model-len", str(max_model_len),
                   "--max-num-seqs", "8", "--no-enable-prefix-caching", "--host", "127.0.0.1", "--port", str(port),
                   *extra_args]
        self.server = LaunchedServer(ServerCommand("vllm", command, port, {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gb)}),
                                     log)
        self.url = self.server.command.url

    def __enter__(self) -> "VllmServer":
        self.server.start_and_wait(START_TIMEOUT)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self.server.stop(STOP_GRACE)

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
