"""Shared test set-up."""

import os

import pytest
import torch

from launch_fixtures import fake  # noqa: F401  (the fake engine's fixture, for the launcher's tests)
from tiny_models import tiny_checkpoint

# Tiny models gain nothing from intra-op threads, and OpenMP spin-waiting makes them
# 10-25x slower whenever the cores are shared with anything else.
torch.set_num_threads(1)

# A KV cache big enough that the shared tiny engine never preempts.
# fp32: the exactness and parity tests compare token for token
TINY_ENGINE = dict(dtype="float32", num_kv_blocks=512, block_size=4, max_model_len=96, max_num_batched_tokens=1024)


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory):
    """Compiled graphs (models/compile/cache.py) go to a directory of this session, never the user's cache; a
    server a test starts inherits it. Tests that count compilations point it at their own directory."""
    previous = os.environ.get("SPECWISE_COMPILE_CACHE")
    os.environ["SPECWISE_COMPILE_CACHE"] = str(tmp_path_factory.mktemp("compiled"))
    yield
    if previous is None:
        os.environ.pop("SPECWISE_COMPILE_CACHE")
    else:
        os.environ["SPECWISE_COMPILE_CACHE"] = previous


@pytest.fixture(scope="session")
def tiny_llm():
    from specwise.engine.llm import LLM
    return LLM(checkpoint=tiny_checkpoint(), **TINY_ENGINE)


@pytest.fixture
def llm(tiny_llm):
    """The shared tiny engine, checked afterwards: nothing in flight, every KV block free."""
    yield tiny_llm
    engine = tiny_llm.engine
    left_over = list(engine.requests)
    for request_id in left_over:            # clean up first, so one failure does not cascade
        engine.abort(request_id)
    while engine.has_unfinished():
        engine.step()
    assert not left_over, f"a test left requests in the shared engine: {left_over}"
    engine.block_manager.check_invariants()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
