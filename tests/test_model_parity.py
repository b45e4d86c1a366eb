"""Logits and greedy parity with Hugging Face transformers, in fp32.

Tiny random Llama / Qwen2 configurations (default, llama3 and linear rope scaling, attention
bias with tied embeddings) run through `ModelRunner.forward` over a paged KV cache: whole
prefills, a prefill split in two chunks, and ragged batches with padding. The default model
(integration) is loaded by our GGUF loader and by transformers' own GGUF reader.
Run with `-s` to see the max abs differences.
"""

from pathlib import Path

import pytest
import torch

from specwise.engine.llm import LLM
from specwise.engine.model_runner import ModelRunner
from specwise.models.checkpoints.loader import Checkpoint
from specwise.models.config import ModelConfig
from specwise.models.llama import LlamaForCausalLM
from specwise.models.rope import inverse_frequencies
from specwise.sampling_params import SamplingParams
from tiny_models import byte_tokenizer, hf_config, random_weights

transformers = pytest.importorskip("transformers")

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               # small, so that the tiny head_dim's wavelengths fall on all three sides of the band
               "original_max_position_embeddings": 64}
CASES = {
    "llama": dict(arch="llama"),
    "llama-rope-llama3": dict(arch="llama", rope_scaling=LLAMA3_ROPE),
    "llama-rope-linear": dict(arch="llama", rope_scaling={"rope_type": "linear", "factor": 4.0}),
    "qwen2-bias-tied": dict(arch="qwen2", tie=True),
}
TINY_TOLERANCE = 2e-4       # fp32; logits reach ~80 on these models
DEFAULT_MODEL_TOLERANCE = 1e-3
BLOCK_SIZE = 4


def report(label: str, ours: torch.Tensor, theirs: torch.Tensor, tolerance: float) -> None:
    diff = (ours - theirs).abs().max().item()
    print(f"\n[parity] {label}: max abs logits diff {diff:.2e} (|logits| up to {theirs.abs().max().item():.1f})")
    assert diff <= tolerance, f"{label}: max abs logits diff {diff:.2e} > {tolerance:.0e}"


class Pair:
    """A HF model and ours with the same weights, plus a paged-cache runner for ours."""

    def __init__(self, name: str):
        self.name = name
        hf_dict = hf_config(**CASES[name])
        self.config = ModelConfig.from_hf(hf_dict)
        kwargs = {k: v for k, v in hf_dict.items() if k != "model_type"}
        hf_model_config = transformers.AutoConfig.for_model(hf_dict["model_type"], **kwargs)
        self.hf = transformers.AutoModelForCausalLM.from_config(hf_model_config, attn_implementation="eager")
        # the default init (std 0.02) gives near-uniform attention; these weights make it peaked
        missing, unexpected = self.hf.load_state_dict(random_weights(self.config, seed=1), strict=False)
        assert unexpected == [] and missing == (["lm_head.weight"] if self.config.tie_word_embeddings else [])
        self.hf.eval()
        self.weights = self.hf.state_dict()
        self.model = LlamaForCausalLM(self.config).eval()
        self.model.load_weights(self.weights)
        self.runner = ModelRunner(self.model, num_blocks=128, block_size=BLOCK_SIZE, dtype=torch.float32)

    @torch.no_grad()
    def hf_logits(self, token_ids: list[int]) -> torch.Tensor:
        return self.hf(torch.tensor([token_ids])).logits[0].float()    # [len, vocab]

    def forward(self, runs: list[list[int]], starts: list[int], tables: list[list[int]]) -> torch.Tensor:
        return padded_logits(self.runner, runs, starts, tables)


def padded_logits(runner, runs, starts, tables) -> torch.Tensor:
    """Logits at every position, [num_runs, longest run, vocab] (rows past a run's end are zero)."""
    flat = runner.forward(runs, starts, tables, num_logits=[len(run) for run in runs])     # [sum(lens), vocab]
    padded = flat.new_zeros(len(runs), max(map(len, runs)), flat.shape[-1])
    for row, part in enumerate(flat.split([len(run) for run in runs])):
        padded[row, :len(part)] = part
    return padded


@pytest.fixture(scope="module", params=list(CASES))
def pair(request) -> Pair:
    return Pair(request.param)


def random_ids(length: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def scattered_blocks(row: int, num_blocks: int = 12) -> list[int]:
    """Disjoint per row, non-contiguous and out of order, as a long-running cache hands them out."""
    return [(37 * i) % 128 for i in range(row * num_blocks, (row + 1) * num_blocks)]


def test_rotary_frequencies_match(pair):
    theirs = pair.hf.model.rotary_emb.inv_freq.float()
    ours = inverse_frequencies(pair.config.head_dim, pair.config.rope_theta, pair.config.rope_scaling).float()
    torch.testing.assert_close(ours, theirs)


def test_prefill_logits_match(pair):
    ids = random_ids(45, seed=0)
    ours = pair.forward([ids], [0], [scattered_blocks(0)])[0]
    report(f"{pair.name} prefill", ours, pair.hf_logits(ids), TINY_TOLERANCE)


def test_prefill_split_in_two_chunks_matches(pair):
    ids = random_ids(45, seed=1)
    table = scattered_blocks(1)
    first = pair.forward([ids[:23]], [0], [table])[0]
    second = pair.forward([ids[23:]], [23], [table])[0]     # reads the first chunk's K/V from the cache
    report(f"{pair.name} chunked prefill", torch.cat([first, second]), pair.hf_logits(ids), TINY_TOLERANCE)


def test_ragged_batch_with_padding_then_ragged_decode_matches(pair):
    seqs = [random_ids(length, seed=10 + length) for length in (7, 40, 18)]
    tables = [scattered_blocks(row) for row in range(3)]
    prefill = pair.forward(seqs, [0, 0, 0], tables)                      # [3, 40, vocab], rows padded
    worst = max(((prefill[row, :len(ids)] - pair.hf_logits(ids)).abs().max().item(), row)
                for row, ids in enumerate(seqs))
    # next step: one token for two sequences, one token plus three more (as when verifying drafts) for the third
    extra = [random_ids(1, seed=20), random_ids(4, seed=21), random_ids(1, seed=22)]
    decode = pair.forward(extra, [len(ids) for ids in seqs], tables)     # [3, 4, vocab]
    ours = torch.cat([prefill[row, :len(ids)] for row, ids in enumerate(seqs)] +
                     [decode[row, :len(run)] for row, run in enumerate(extra)])
    theirs = torch.cat([pair.hf_logits(ids) for ids in seqs] +
                       [pair.hf_logits(ids + run)[len(ids):] for ids, run in zip(seqs, extra)])
    assert worst[0] <= TINY_TOLERANCE, f"prefill row {worst[1]} differs by {worst[0]:.2e}"
    report(f"{pair.name} ragged batch + decode", ours, theirs, TINY_TOLERANCE)


def test_engine_greedy_matches_hf_greedy(pair):
    prompt = random_ids(12, seed=2)
    checkpoint = Checkpoint(pair.config, pair.weights, byte_tokenizer(), Path(pair.name))
    llm = LLM(checkpoint=checkpoint, dtype="float32", num_kv_blocks=32, block_size=BLOCK_SIZE, max_model_len=64,
              max_num_batched_tokens=64)
    ours = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0].output_token_ids
    ids = list(prompt)
    for _ in range(20):                                     # plain recompute, no cache: the reference
        ids.append(int(pair.hf_logits(ids)[-1].argmax()))
    assert ours == ids[len(prompt):]


# --- the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) --------------------------------------------------------

CHATS = ["What is the capital of France?", "Write a Python function that reverses a string.",
         "List three colors of the rainbow."]
PLAIN = ["Once upon a time, in a small village,", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def default_llm():
    return LLM(dtype="float32", num_kv_blocks=64, block_size=16, max_model_len=1024, max_num_batched_tokens=1024)


@pytest.fixture(scope="module")
def hf_default():
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load a GGUF file")
    from specwise.models.checkpoints.default_model import default_model_path
    path = default_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32)
    return model.eval()


def default_prompts(llm) -> list[list[int]]:
    chats = [llm.tokenizer.apply_chat_template([{"role": "user", "content": text}]) for text in CHATS]
    return chats + [llm.tokenizer.encode(text) for text in PLAIN]


@pytest.mark.integration
def test_default_model_logits_match_transformers(default_llm, hf_default):
    prompts = default_prompts(default_llm)
    tables = [list(range(row * 4, row * 4 + 4)) for row in range(len(prompts))][::-1]
    ours = padded_logits(default_llm.engine.runner, prompts, [0] * len(prompts), tables)
    with torch.no_grad():
        theirs = [hf_default(torch.tensor([ids])).logits[0].float() for ids in prompts]
    report("default model, ragged batch of 5 prompts",
           torch.cat([ours[row, :len(ids)] for row, ids in enumerate(prompts)]), torch.cat(theirs),
           DEFAULT_MODEL_TOLERANCE)


@pytest.mark.integration
def test_default_model_greedy_matches_transformers(default_llm, hf_default):
    prompts = default_prompts(default_llm)
    ours = [o.output_token_ids for o in default_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32))]
    eos = default_llm.tokenizer.eos_token_ids
    theirs = []
    with torch.no_grad():
        for ids in prompts:
            generated = hf_default.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                            max_new_tokens=32, do_sample=False, eos_token_id=eos, pad_token_id=eos[0])
            theirs.append(generated[0, len(ids):].tolist())
    for text, mine, reference in zip(CHATS + PLAIN, ours, theirs):
        print(f"\n[greedy] {text!r}: {default_llm.tokenizer.decode(mine)!r}")
        assert mine == reference, f"{text!r}: ours {mine} vs transformers {reference}"
