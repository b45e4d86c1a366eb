"""Self-distillation data: the target's own responses, and its features at every position.

Two stages, each cached under OUT/work/data-<key>/ (the key hashes the prompts, the target and the
generation settings, so a rerun or `--resume` with the same ones reuses them):

  responses.jsonl   one line per prompt as soon as its response is done (an interrupted run keeps
                    what it generated); the target answers with our batched engine
  features.safetensors
      token_ids     [num_tokens] int32    prompt + response of every sequence, concatenated
      features      [num_tokens, hidden]  bf16, the target's final-normed hidden state f_t
      target_next   [num_tokens] int32    argmax lm_head(f_t): the target's greedy token t+1
      offsets       [num_seqs + 1] int64  sequence s is rows offsets[s] .. offsets[s+1]
      response_start [num_seqs] int64     first response position within the sequence
      held_out      [num_seqs] uint8      1: kept for the acceptance measured each epoch
      category      [num_seqs] int64      index into meta.json's "categories" ("corpus": --corpus texts,
                                          corpus.py, after the responses)
      aux           [num_tokens, 3 * hidden] bf16 (eagle3 only): the residual streams after its three
                    layers, side by side (models/heads/eagle3.py); then in features-layers-L1-L2-L3.safetensors,
                    recorded from the same cached responses

Features come from teacher-forced forwards of the target over prompt + response (flat prefill
chunks over a scratch KV cache, as the engine computes them, in the engine's dtype).
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from safetensors.torch import load_file, save_file

from specwise.bench.inputs.request import WorkloadRequest
from specwise.engine.llm_engine import LLMEngine
from specwise.models.attention import AttentionMetadata, PrefillChunk, step_metadata
from specwise.models.llama import LlamaForCausalLM
from specwise.sampling_params import SamplingParams

FEATURES_FILE, RESPONSES_FILE, META_FILE = "features.safetensors", "responses.jsonl", "meta.json"
FORWARD_TOKENS = 4096          # tokens per teacher-forced forward
CORPUS_CATEGORY = "corpus"     # the category of --corpus texts


@dataclass
class Corpus:
    """The recorded data, in memory (see the module docstring for the shapes)."""
    token_ids: torch.Tensor
    features: torch.Tensor
    target_next: torch.Tensor
    offsets: torch.Tensor
    response_start: torch.Tensor
    held_out: torch.Tensor
    category: torch.Tensor
    categories: list[str]
    aux: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.response_start)

    def rows(self, seq: int) -> slice:
        return slice(int(self.offsets[seq]), int(self.offsets[seq + 1]))

    def length(self, seq: int) -> int:
        return int(self.offsets[seq + 1] - self.offsets[seq])

    def split(self, held_out: bool) -> list[int]:
        return [s for s in range(self.num_seqs) if bool(self.held_out[s]) == held_out]

    def num_tokens(self, seqs: list[int]) -> int:
        return sum(self.length(s) for s in seqs)


def progress_bar() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[info]}"))


def data_key(requests: list[WorkloadRequest], signature: dict, settings: dict) -> str:
    rows = [[r.request_id, r.category, r.prompt, r.messages, r.max_tokens] for r in requests]
    text = json.dumps([rows, signature, settings], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def features_file(aux_layers: list[int] | None) -> str:
    return FEATURES_FILE if not aux_layers else f"features-layers-{'-'.join(map(str, aux_layers))}.safetensors"


def build_corpus(engine: LLMEngine, requests: list[WorkloadRequest], held_out: list[bool], work: Path,
                 max_tokens: int, temperature: float, seed: int, aux_layers: list[int] | None = None,
                 texts: list[list[int]] | None = None) -> Corpus:
    """Responses, then features (and the aux_layers' residual streams), each read back from `work` when
    already there. texts (--corpus, corpus.py): more sequences, taken as they are (category "corpus",
    never held out, every position trained)."""
    work.mkdir(parents=True, exist_ok=True)
    features_path = work / features_file(aux_layers)
    if features_path.is_file():
        return read_corpus(work, aux_layers)
    recorded_with_layers = sorted(work.glob(features_file([0]).replace("0", "*")))
    if not aux_layers and recorded_with_layers:         # an eagle3 run recorded the features too
        return read_corpus(work, None, recorded_with_layers[0].name)
    sequences, response_start = generate(engine, requests, work / RESPONSES_FILE, max_tokens, temperature, seed)
    categories = sorted({r.category for r in requests} | ({CORPUS_CATEGORY} if texts else set()))
    category = [categories.index(r.category) for r in requests]
    if texts:
        sequences, response_start = sequences + texts, response_start + [1] * len(texts)
        held_out = list(held_out) + [False] * len(texts)
        category = category + [categories.index(CORPUS_CATEGORY)] * len(texts)
    corpus = record_features(engine.model, engine.dtype, sequences, response_start, held_out, category, categories,
                             aux_layers)
    names = ("token_ids", "features", "target_next", "offsets", "response_start", "held_out", "category")
    tensors = {name: getattr(corpus, name).contiguous() for name in names + (("aux",) if aux_layers else ())}
    partial = features_path.with_name(features_path.name + ".partial")
    save_file(tensors, str(partial))
    (work / META_FILE).write_text(json.dumps({"categories": categories,
                                              "request_ids": [r.request_id for r in requests]}, indent=1) + "\n")
    partial.replace(features_path)
    return corpus


def read_corpus(work: Path, aux_layers: list[int] | None = None, name: str | None = None) -> Corpus:
    tensors = load_file(str(work / (name or features_file(aux_layers))))
    if not aux_layers:
        tensors.pop("aux", None)
    meta = json.loads((work / META_FILE).read_text())
    return Corpus(**tensors, categories=meta["categories"])


def generate(engine: LLMEngine, requests: list[WorkloadRequest], path: Path, max_tokens: int,
             temperature: float, seed: int) -> tuple[list[list[int]], list[int]]:
    """(prompt + response token ids, prompt length) per request, in request order; lines already in
    `path` are kept."""
    done: dict[int, dict] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
                done[row["index"]] = row
            except (json.JSONDecodeError, KeyError):
                break                                   # a line cut by an interruption: regenerate from there
    pending = [i for i in range(len(requests)) if i not in done]
    if pending:
        with progress_bar() as progress, open(path, "a", encoding="utf-8") as sink:
            task = progress.add_task("generating responses", total=len(requests), completed=len(done), info="")
            by_id = {}
            for index in pending:
                request = requests[index]
                prompt = request.messages if request.messages is not None else request.prompt
                params = SamplingParams(temperature=temperature, max_tokens=min(request.max_tokens, max_tokens),
                                        seed=seed + index)
                by_id[engine.add_request(prompt, params, request_id=f"train-{index}")] = index
            produced = 0
            while engine.has_unfinished():
                for output in engine.step():
                    produced += len(output.new_token_ids)
                    if output.finished:
                        index = by_id[output.request_id]
                        row = {"index": index, "id": requests[index].request_id,
                               "prompt_token_ids": output.prompt_token_ids,
                               "output_token_ids": output.output_token_ids}
                        sink.write(json.dumps(row) + "\n")
                        sink.flush()
                        done[index] = row
                        progress.update(task, advance=1, info=f"{produced} tokens")
    rows = [done[i] for i in range(len(requests))]
    return [r["prompt_token_ids"] + r["output_token_ids"] for r in rows], [len(r["prompt_token_ids"]) for r in rows]


@torch.inference_mode()
def record_features(model: LlamaForCausalLM, dtype: torch.dtype, sequences: list[list[int]],
                    response_start: list[int], held_out: list[bool], category: list[int],
                    categories: list[str], aux_layers: list[int] | None = None) -> Corpus:
    """Teacher-forced forwards over prompt + response, FORWARD_TOKENS at a time."""
    device = model.embed_tokens.weight.device
    features, target_next, batch, aux = [], [], [], []
    with progress_bar() as progress:
        task = progress.add_task("recording features", total=len(sequences), info="")
        for index, sequence in enumerate(sequences):
            batch.append(sequence)
            if index + 1 == len(sequences) or sum(map(len, batch)) + len(sequences[index + 1]) > FORWARD_TOKENS:
                residuals = dict.fromkeys(aux_layers) if aux_layers else None
                hidden = teacher_forced(model, batch, dtype, device, residuals)      # [tokens, hidden]
                features.append(hidden.to(torch.bfloat16).cpu())
                if residuals is not None:                                           # [tokens, 3 * hidden]
                    aux.append(torch.cat([residuals[i] for i in aux_layers], dim=-1).to(torch.bfloat16).cpu())
                target_next.append(model.compute_logits(hidden).argmax(dim=-1).to(torch.int32).cpu())
                progress.update(task, advance=len(batch))
                batch = []
    lengths = torch.tensor([len(s) for s in sequences])
    return Corpus(token_ids=torch.tensor([t for s in sequences for t in s], dtype=torch.int32),
                  features=torch.cat(features), target_next=torch.cat(target_next),
                  offsets=torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
                  response_start=torch.tensor(response_start, dtype=torch.long),
                  held_out=torch.tensor(held_out, dtype=torch.uint8),
                  category=torch.tensor(category, dtype=torch.long), categories=categories,
                  aux=torch.cat(aux) if aux else None)


def teacher_forced(model: LlamaForCausalLM, sequences: list[list[int]], dtype: torch.dtype,
                   device, residuals: dict | None = None) -> torch.Tensor:
    """Final-normed hidden states [sum(len), hidden] of whole sequences, each a prefill chunk (residuals:
    filled as LlamaForCausalLM.forward does)."""
    config = model.config
    num_tokens = sum(map(len, sequences))
    scratch = torch.zeros(config.num_hidden_layers, 2, config.num_key_value_heads, num_tokens, config.head_dim,
                          dtype=dtype, device=device)
    starts = [0]
    for sequence in sequences:
        starts.append(starts[-1] + len(sequence))
    metadata = AttentionMetadata(torch.arange(num_tokens, device=device),
                                 [PrefillChunk(a, b) for a, b in zip(starts, starts[1:])], [])
    input_ids = torch.tensor([t for s in sequences for t in s], device=device)
    positions = torch.tensor([p for s in sequences for p in range(len(s))], device=device)
    with step_metadata(metadata):
        return model(input_ids, positions, scratch, None, residuals)
