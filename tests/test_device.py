"""Every tensor of a step lives on the runner's device: the model, the index tensors, the sampling
distribution and the padded draft probabilities. Run on the `meta` device, where no value exists,
so a tensor built on the CPU by mistake (or a size read back from the device) fails loudly."""

import torch

from specwise.engine.model_runner import ModelRunner
from specwise.engine.sampling.sampler import request_generator
from specwise.engine.sequence import Sequence
from specwise.engine.spec_decode.proposer import Proposal
from specwise.models.llama import LlamaForCausalLM
from specwise.sampling_params import SamplingParams
from tiny_models import tiny_checkpoint


def meta_runner() -> ModelRunner:
    config = tiny_checkpoint().config
    with torch.device("meta"):
        model = LlamaForCausalLM(config, max_positions=64)
    return ModelRunner(model.eval(), num_blocks=8, block_size=4, dtype=torch.float32, device="meta")


def test_a_verification_step_stays_on_the_runners_device():
    runner = meta_runner()
    vocab_size = runner.model.config.vocab_size
    # a prefill of 3 tokens beside a verification of 1 + 2 drafts over 5 cached tokens
    logits = runner.forward([[1, 2, 3], [4, 5, 6]], [0, 5], [[0], [1, 2]], num_logits=[3, 3])
    assert logits.device.type == "meta" and tuple(logits.shape) == (6, vocab_size)
    last = runner.forward([[1, 2, 3], [4]], [0, 5], [[0], [1, 2]], num_logits=[1, 1])
    assert last.device.type == "meta" and tuple(last.shape) == (2, vocab_size)
    logits = logits.view(2, 3, vocab_size)
    seqs = [Sequence("sampled", [1], SamplingParams(temperature=0.8, top_k=5, top_p=0.9)),
            Sequence("greedy", [1], SamplingParams(temperature=0))]
    probs = runner.probs(logits, seqs)
    assert probs.device.type == "meta" and tuple(probs.shape) == (2, 3, vocab_size)
    proposal = Proposal([[7, 8], [9]], [torch.rand(2, vocab_size), None])
    draft_probs = proposal.padded_draft_probs(2, vocab_size, runner.device)
    assert draft_probs.device.type == "meta" and tuple(draft_probs.shape) == (2, 2, vocab_size)


def test_request_generators_live_on_the_runners_device():
    runner = ModelRunner(tiny_model(), num_blocks=8, block_size=4, dtype=torch.float32, device="cpu")
    seq = Sequence("r", [1], SamplingParams(temperature=1.0, seed=7))
    assert runner.generator(seq).device == torch.device("cpu")
    assert runner.generator(seq) is runner.generator(seq)            # one stream per request
    draws = torch.rand(3, generator=request_generator(7, "cpu"))
    assert torch.equal(draws, torch.rand(3, generator=runner.generator(Sequence("s", [1], SamplingParams(seed=7)))))


def tiny_model() -> LlamaForCausalLM:
    return LlamaForCausalLM(tiny_checkpoint().config, max_positions=64).eval()
