"""GuideLLM (the benchmark client vLLM's docs recommend) against `specwise serve`, as a user runs it.

Issue 16: GuideLLM 0.8 sends vLLM's `stream_options.continuous_usage_stats`, and every one of
its requests used to fail with 400. Here it runs a short concurrent benchmark (streamed chat
completions, synthetic prompts) with and without speculation, and finds no errored request
and token counts equal to the server's own (/metrics prompt and generation tokens).

Slow-marked; skipped with the reason when the `guidellm` command is not installed
(`pip install guidellm`, or point SPECWISE_GUIDELLM at its executable).
"""

import json
import os
import shutil
import subprocess

import pytest
from test_server_harness import metric, serve
from tiny_checkpoints import make_tiny_hf_config, random_state_dict, write_hf_checkpoint

from specwise.config import EngineConfig
from specwise.engine.llm_engine import LLMEngine

GUIDELLM = os.environ.get("SPECWISE_GUIDELLM") or shutil.which("guidellm")
NUM_REQUESTS = 12
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(GUIDELLM is None, reason="guidellm is not installed (pip install guidellm, "
                                                          "or set SPECWISE_GUIDELLM to its executable)")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    config = make_tiny_hf_config()
    return write_hf_checkpoint(tmp_path_factory.mktemp("guidellm") / "tiny", config, random_state_dict(config))


@pytest.mark.parametrize("speculative", [None, "ngram"])
def test_guidellm_benchmark_has_no_errors_and_our_token_counts(model_dir, tmp_path, speculative):
    engine = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", max_model_len=512,
                                    speculative=speculative, num_speculative_tokens=3))
    with serve(engine) as server:
        report = tmp_path / "guidellm.json"
        command = [GUIDELLM, "run", "--backend", f"kind=openai_http,target={server.base_url}",
                   "--profile", "kind=concurrent,streams=4",
                   "--data", "kind=synthetic_text,prompt_tokens=64,output_tokens=16",
                   "--tokenizer", f"kind=huggingface_auto,model={model_dir}",
                   "--constraint", f"kind=max_requests,count={NUM_REQUESTS}",
                   "--output", f"kind=json,path={report}", "--disable-console-interactive"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        requests = json.loads(report.read_text())["benchmarks"][0]["requests"]
        assert not requests["errored"], requests["errored"][:2]
        assert len(requests["successful"]) == NUM_REQUESTS
        samples = server.metrics()
        assert sum(r["prompt_tokens"] for r in requests["successful"]) == metric(samples, "specwise:prompt_tokens_total")
        assert sum(r["output_tokens"] for r in requests["successful"]) == \
            metric(samples, "specwise:generation_tokens_total")
        if speculative:
            assert engine.stats.drafts > 0
