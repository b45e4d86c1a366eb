"""`specwise serve`: flags from ServerConfig, and the real command on a tiny HF checkpoint directory."""

import gc
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from tiny_checkpoints import make_tiny_hf_config, random_state_dict, write_hf_checkpoint

from specwise.bench.launch.command import free_port
from specwise.cli import build_parser
from specwise.cli_args import dataclass_from_args
from specwise.config import EngineConfig
from specwise.errors import ConfigError
from specwise.server.cli import settle_heap, uvicorn_config
from specwise.server.config import ServerConfig
from capability_marks import cpu_kernels

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("field, value", [("port", -1), ("port", 70_000), ("max_queue", -1), ("api_key", " "),
                                          ("max_body_bytes", 10), ("shutdown_timeout", -1), ("log_level", "loud"),
                                          ("host", ""), ("served_model_name", ""),
                                          ("keep_alive_timeout", 0), ("watchdog_timeout", -1)])
def test_server_config_refuses_bad_values(field, value):
    with pytest.raises(ConfigError, match=field):
        ServerConfig(**{field: value})


def test_loopback_is_the_default():
    assert ServerConfig().host == "127.0.0.1" and ServerConfig().is_loopback
    assert ServerConfig(host="::1").is_loopback and ServerConfig(host="localhost").is_loopback
    assert not ServerConfig(host="0.0.0.0").is_loopback


def test_serve_flags_build_both_configs():
    args = build_parser().parse_args(["serve", "--port", "0", "--api-key", "k", "--max-queue", "3",
                                      "--max-model-len", "128", "--speculative", "ngram"])
    config = dataclass_from_args(ServerConfig, args)
    assert (config.host, config.port, config.api_key, config.max_queue) == ("127.0.0.1", 0, "k", 3)
    engine_config = dataclass_from_args(EngineConfig, args)
    assert (engine_config.max_model_len, engine_config.speculative) == (128, "ngram")


@cpu_kernels
def test_serve_compiles_unless_told_not_to_and_other_commands_do_not():
    def compiles(argv):
        return dataclass_from_args(EngineConfig, build_parser().parse_args(argv)).compile
    assert compiles(["serve"]) and not compiles(["serve", "--no-compile"])
    assert not compiles(["generate", "--prompt", "hi"]) and compiles(["generate", "--prompt", "hi", "--compile"])
    # evaluate: the compiled graphs if the cache holds them (None), else as told
    assert compiles(["evaluate"]) is None and compiles(["evaluate", "--compile"]) is True
    assert compiles(["evaluate", "--no-compile"]) is False


def wait_for_health(process: subprocess.Popen, base: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1]
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("specwise serve did not become healthy")


def test_specwise_serve_subprocess(tmp_path):
    config = make_tiny_hf_config()
    model = write_hf_checkpoint(tmp_path / "tiny-hf", config, random_state_dict(config))
    port = free_port()
    command = [sys.executable, "-m", "specwise.cli", "serve", "--model", str(model), "--port", str(port),
               "--max-model-len", "128", "--num-kv-blocks", "64", "--speculative", "ngram", "--api-key", "sekret",
               "--no-compile"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(process, base)
        denied = httpx.get(f"{base}/v1/models")
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="sekret", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["tiny-hf"]
        reply = client.chat.completions.create(model="tiny-hf", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=5, temperature=0)
        assert reply.usage.completion_tokens <= 5 and reply.choices[0].finish_reason in ("stop", "length")
        stream = client.completions.create(model="tiny-hf", prompt="The fox", max_tokens=5, stream=True)
        assert any(chunk.choices[0].finish_reason for chunk in stream)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, stderr
        assert "server stopped" in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


@cpu_kernels
def test_serve_waiting_for_compile_says_what_compiling_needs(tmp_path):
    """`specwise serve --wait-for-compile` compiles the model before serving; on a machine without a C++ compiler
    it stops at start-up with an error naming the compiler and the way out, rather than serving or hanging."""
    config = make_tiny_hf_config()
    model = write_hf_checkpoint(tmp_path / "tiny-hf", config, random_state_dict(config))
    command = [sys.executable, "-m", "specwise.cli", "serve", "--model", str(model), "--port", str(free_port()),
               "--max-model-len", "64", "--num-kv-blocks", "32", "--dtype", "float32", "--wait-for-compile"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CXX": str(tmp_path / "no-such-compiler"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}       # nothing compiled earlier to reuse
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "C++ compiler" in result.stderr and "--no-compile" in result.stderr, result.stderr[-2000:]
    assert "serving" not in result.stderr


def test_model_id_defaults_to_the_checkpoint_name(tmp_path):
    from specwise.server.app import model_name
    assert model_name(None) == "SmolLM2-135M-Instruct"
    assert model_name(str(tmp_path / "my-model.gguf")) == "my-model"
    assert model_name(str(tmp_path / "hf-dir") + "/") == "hf-dir"


def test_settle_heap_leaves_the_objects_alive_at_startup_out_of_full_collections():
    started_with = [object() for _ in range(3)]          # stands for the model, tokenizer and app built at startup
    frozen_before = gc.get_freeze_count()
    try:
        settle_heap()
        assert gc.get_freeze_count() > frozen_before
        assert not any(candidate is started_with for candidate in gc.get_objects(generation=2))
        made_later = [object()]
        assert any(candidate is made_later for candidate in gc.get_objects())     # new objects are still collected
    finally:
        gc.unfreeze()


def test_the_server_runs_httptools_and_uvloop_where_installed():
    config = uvicorn_config(None, ServerConfig())
    assert config.http == "httptools"
    assert config.loop == ("uvloop" if importlib.util.find_spec("uvloop") else "asyncio")
    if sys.platform == "linux":
        assert config.loop == "uvloop"          # a dependency on Linux (pyproject.toml): the install provides it
