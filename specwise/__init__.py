"""specwise: does speculative decoding pay for your workload, at your concurrency?"""

from specwise.config import EngineConfig
from specwise.sampling_params import SamplingParams

__all__ = ["EngineConfig", "SamplingParams", "LLM"]


def __getattr__(name):
    if name == "LLM":
        from specwise.engine.llm import LLM
        return LLM
    raise AttributeError(name)
