"""The shipped EAGLE head, exported for vLLM, runs in vLLM for CPU: its greedy output is the target's own
(vLLM without speculation) and it drafts tokens vLLM accepts. Needs vLLM's own venv (benchmarks/README.md,
vs_vllm.sh) and minutes: two vLLM starts, eager, fp32, on 127.0.0.1, each stopped by its PID."""

import json

import pytest
import torch

from specwise.models.checkpoints.loader import load_checkpoint
from specwise.models.export.drafter_export import export_drafter
from specwise.models.export.hf_writer import write_hf_dir
from specwise.models.heads.builtin import find_builtin_head
from specwise.monitor.exposition import parse_snapshot
from vllm_process import VLLM_PYTHON, VllmServer

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=f"no vLLM venv at {VLLM_PYTHON.parent.parent} "
                                                                  f"(benchmarks/vs_vllm.sh installs it)")]

PROMPTS = ["What is 17 times 23? Explain step by step.",
           "Write a Python function that reverses a string.",
           "Name three rivers in Europe and one fact about each."]


def test_vllm_with_the_exported_head_gives_the_target_s_greedy_output(tmp_path):
    target = load_checkpoint(None)
    model_dir = write_hf_dir(tmp_path / "target", target.config, target.weights, target.tokenizer, torch.float32)
    head = find_builtin_head("eagle", target.config, target.tokenizer)
    export_drafter(head, "vllm", tmp_path / "exported", target)
    messages = [[{"role": "user", "content": prompt}] for prompt in PROMPTS]

    with VllmServer(model_dir, ["--enforce-eager"], tmp_path / "off.log") as server:
        alone = [server.complete(chat, max_tokens=32) for chat in messages]
    spec = json.dumps({"method": "eagle", "model": str(tmp_path / "exported"), "num_speculative_tokens": 4})
    with VllmServer(model_dir, ["--enforce-eager", "--speculative-config", spec], tmp_path / "eagle.log") as server:
        speculated = [server.complete(chat, max_tokens=32) for chat in messages]
        acceptance = parse_snapshot(server.metrics(), 0.0, "vllm").acceptance

    assert speculated == alone
    # the head drafts what the target says about as often as in our engine (~0.1 of draft tokens on the suite);
    # a mis-laid weight (fc halves unswapped, say) drafts noise: next to no token accepted
    rate = acceptance.accepted_tokens / acceptance.draft_tokens
    assert acceptance.drafts > 0 and rate > 0.05, f"{acceptance}"
