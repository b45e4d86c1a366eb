"""The in-process engine as evaluation targets: one model load, one target per arm.

All arms share one LLMEngine behind one AsyncEngine; an arm's start() switches the
drafter with `engine.set_speculative(spec, k)` (None = no speculation), so arms take
turns (round by round, bench/load/schedule.py) on the same loaded weights. Each engine step that advances a request
becomes one TokenChunk carrying `len(new_token_ids)` tokens (several per step under
speculation); the final output gives Usage and the request's speculative counters.
"""

import asyncio
import dataclasses
import time
import uuid
import zlib
from typing import AsyncIterator

from specwise.bench.load.arms import ArmSpec
from specwise.bench.load.targets.base import Acceptance, ServerAcceptance, StreamEvent, TokenChunk, Usage
from specwise.bench.inputs.request import WorkloadRequest
from specwise.config import EngineConfig
from specwise.sampling_params import SamplingParams

SWITCH_TIMEOUT = 120.0


class EngineTarget:
    def __init__(self, arm: ArmSpec, async_engine, temperature: float = 0.0, seed: int = 0,
                 serving: dict | None = None):
        self.name, self.method, self.arm = arm.name, arm.method, arm
        self.serving = {"arm": None} if serving is None else serving     # shared: whose drafter is loaded
        self.async_engine = async_engine
        self.temperature, self.seed = temperature, seed

    async def start(self) -> None:
        pass

    async def activate(self) -> None:
        if self.serving["arm"] != self.name:
            await asyncio.to_thread(self._switch_drafter)

    def _switch_drafter(self) -> None:
        """In a worker thread: wait for requests cut off by the previous arm to be aborted
        (the step thread does that before its next step), then switch, on the step thread (a drafter
        may load weights: torch work stays on that thread, see async_engine.py)."""
        deadline = time.monotonic() + SWITCH_TIMEOUT
        while True:
            if self.async_engine.call(self._switch_when_idle):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"arm {self.name}: the engine still has requests in flight after "
                                   f"{SWITCH_TIMEOUT:g} s; cannot switch the drafter")
            time.sleep(0.05)

    def _switch_when_idle(self, engine) -> bool:
        if engine.has_unfinished():
            return False
        engine.set_speculative(self.arm.spec, self.arm.k or 0)
        self.serving["arm"] = self.name
        return True

    async def reconnect(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def server_acceptance(self) -> ServerAcceptance | None:
        return None

    async def stream(self, request: WorkloadRequest) -> AsyncIterator[StreamEvent]:
        params = SamplingParams(temperature=self.temperature, max_tokens=request.max_tokens,
                                ignore_eos=request.ignore_eos, seed=self._seed(request))
        prompt = request.extra.get("prompt_token_ids") or request.messages or request.prompt
        request_id = f"{request.request_id}-{uuid.uuid4().hex[:8]}"
        async for output in self.async_engine.generate(prompt, params, request_id=request_id):
            if output.new_token_ids:
                yield TokenChunk(time=time.perf_counter(), text=output.new_text, tokens=len(output.new_token_ids))
            if output.finished:
                yield Usage(len(output.prompt_token_ids), len(output.output_token_ids))
                if self.arm.spec is not None:
                    spec = output.spec
                    yield Acceptance(spec.drafts, spec.draft_tokens, spec.accepted_tokens,
                                     list(spec.accepted_per_position))

    def _seed(self, request: WorkloadRequest) -> int | None:
        """Same request, same seed, in every arm (sampled runs compare like with like)."""
        if self.temperature == 0:
            return None
        base_id = request.request_id.split("#")[0]
        return (zlib.crc32(base_id.encode()) + self.seed) % (2 ** 31)


def build_engine_targets(engine_config: EngineConfig, arms: list[ArmSpec], temperature: float = 0.0,
                         seed: int = 0, checkpoint=None):
    """Load the model once (or use `checkpoint`); returns (targets, tokenizer, async engine).

    The caller shuts the async engine down when the run ends (its step thread).
    """
    from specwise.engine.async_engine import AsyncEngine
    from specwise.engine.llm_engine import LLMEngine

    first = arms[0]
    config = dataclasses.replace(engine_config, speculative=first.spec,
                                 num_speculative_tokens=first.k or engine_config.num_speculative_tokens)
    async_engine = AsyncEngine(lambda: LLMEngine(config, checkpoint))     # built on its step thread
    serving = {"arm": None}
    targets = [EngineTarget(arm, async_engine, temperature, seed, serving) for arm in arms]
    return targets, async_engine.engine.tokenizer, async_engine
