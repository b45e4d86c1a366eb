"""`LLM(...).generate(prompts, params)`: the offline loop over the engine seam."""

from specwise.config import EngineConfig
from specwise.engine.llm_engine import LLMEngine, Prompt
from specwise.engine.outputs import RequestOutput
from specwise.models.checkpoints.loader import Checkpoint
from specwise.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str | None = None, checkpoint: Checkpoint | None = None, **config):
        self.engine = LLMEngine(EngineConfig(model=model, **config), checkpoint)
        self.tokenizer = self.engine.tokenizer

    def generate(self, prompts: Prompt | list[Prompt],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """Final output per prompt, in prompt order. A single prompt may be passed bare."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], (int, dict))):
            prompts = [prompts]
        params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        order = [self.engine.add_request(prompt, p) for prompt, p in zip(prompts, params_list)]
        finished = {}
        while self.engine.has_unfinished():
            for output in self.engine.step():
                if output.finished:
                    finished[output.request_id] = output
        return [finished[request_id] for request_id in order]
