"""`specwise train-drafter` from settings to a drafter directory: data, objective, loop, output."""

import importlib.metadata
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specwise.config import EngineConfig
from specwise.engine.llm_engine import LLMEngine
from specwise.models.capabilities import compute_dtype
from specwise.models.checkpoints.drafter import target_signature
from specwise.models.checkpoints.loader import Checkpoint, build_model, load_checkpoint
from specwise.models.export.drafter_export import check_format, export_drafter
from specwise.models.export.export_formats import export_dir
from specwise.models.heads.eagle3 import default_aux_layers
from specwise.train.card import model_card
from specwise.train.config import TrainConfig
from specwise.train.corpus import corpus_fingerprint, read_corpus_texts
from specwise.train.data import CORPUS_CATEGORY, Corpus, build_corpus, data_key
from specwise.train.draft import DraftObjective
from specwise.train.eagle import EagleObjective, active_vocabulary
from specwise.train.eagle3 import Eagle3Objective
from specwise.train.loop import CHECKPOINT_FILE, LoopState, Schedule, train
from specwise.train.medusa import MedusaObjective
from specwise.train.prompts import BUILT_IN, load_prompts, split_held_out

WORK_DIR = "work"


@dataclass
class Prepared:
    engine: LLMEngine
    corpus: Corpus
    prompts_per_category: dict[str, int]
    data_key: str
    target_name: str
    checkpoint: Checkpoint


def prepare(config: TrainConfig, checkpoint: Checkpoint | None = None) -> Prepared:
    """Load the target (unless given), read the prompts, and build (or reuse) the distillation data."""
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    requests = load_prompts(config.data)
    held_out = split_held_out(requests, config.held_out, config.seed)
    dtype = compute_dtype(config.dtype, "cpu")
    checkpoint = checkpoint or load_checkpoint(config.target, dtype)
    engine = LLMEngine(EngineConfig(model=config.target, dtype=config.dtype, max_num_seqs=config.generation_batch,
                                    num_threads=config.num_threads, seed=config.seed), checkpoint)
    settings = dict(max_tokens=config.max_tokens, temperature=config.temperature, seed=config.seed,
                    dtype=str(engine.dtype), held_out=config.held_out)
    texts = None
    if config.corpus:
        texts = read_corpus_texts(config.corpus, checkpoint.tokenizer, config.corpus_tokens, engine.max_model_len)
        settings["corpus"] = corpus_fingerprint(config.corpus, config.corpus_tokens)
    key = data_key(requests, target_signature(checkpoint.config, checkpoint.tokenizer), settings)
    work = Path(config.out).expanduser() / WORK_DIR / f"data-{key}"
    aux_layers = default_aux_layers(checkpoint.config.num_hidden_layers) if config.kind == "eagle3" else None
    corpus = build_corpus(engine, requests, held_out, work, config.max_tokens, config.temperature, config.seed,
                          aux_layers, texts)
    counts: dict[str, int] = {}
    for request in requests:
        counts[request.category] = counts.get(request.category, 0) + 1
    return Prepared(engine, corpus, counts, key, config.target or Path(checkpoint.path).stem, checkpoint)


def build_objective(config: TrainConfig, prepared: Prepared):
    # an fp32 copy with plain nn.Linear layers (a packed kernel has no backward): the engine's may be packed
    target = build_model(prepared.checkpoint, torch.float32, "cpu", prepared.engine.max_model_len, plain=True)
    signature = target_signature(target.config, prepared.engine.tokenizer)
    corpus = prepared.corpus
    train_rows = torch.cat([corpus.target_next[corpus.rows(s)] for s in corpus.split(False)])
    active = active_vocabulary(train_rows, target.config.vocab_size)
    torch.manual_seed(config.seed)                                      # the head's random initialisation
    if config.kind == "eagle":
        return EagleObjective(target, signature, active, unroll=config.unroll, feature_noise=config.feature_noise,
                              feature_weight=config.feature_weight, init_from_target=config.init_from_target)
    if config.kind == "eagle3":
        return Eagle3Objective(target, signature, active, default_aux_layers(target.config.num_hidden_layers),
                               unroll=config.unroll, feature_noise=config.feature_noise)
    if config.kind == "medusa":
        return MedusaObjective(target, signature, active, config.num_heads)
    return DraftObjective(target, prepared.engine.tokenizer, active, config.draft_layers)


def identity(config: TrainConfig, prepared: Prepared) -> dict:
    """What a resumed run must share with the checkpoint: the target first (named by its shapes and
    tokenizer), then every setting that shapes the result, then the data."""
    config_, tokenizer = prepared.checkpoint.config, prepared.checkpoint.tokenizer
    signature = target_signature(config_, tokenizer)
    target = (f"{prepared.target_name} (hidden_size {signature['hidden_size']}, vocab_size {signature['vocab_size']}, "
              f"{signature['num_hidden_layers']} layers, tokenizer {signature['tokenizer_sha256'][:12]})")
    kept = {name: value for name, value in asdict(config).items()
            if name not in ("resume", "num_threads", "out", "export")}
    return {"target model": target, **kept, "data_key": prepared.data_key}


def run(config: TrainConfig, checkpoint: Checkpoint | None = None, log=print) -> Path:
    out = Path(config.out).expanduser()
    if config.export:                       # a format this kind cannot be written in stops before training
        check_format(config.kind, config.export, out)
    started = time.perf_counter()
    prepared = prepare(config, checkpoint)
    data_seconds = time.perf_counter() - started
    corpus = prepared.corpus
    objective = build_objective(config, prepared)
    schedule = Schedule(lr=config.lr, weight_decay=config.weight_decay, warmup_steps=config.warmup_steps,
                        clip=config.clip, epochs=config.epochs, batch_tokens=config.batch_tokens,
                        checkpoint_every=config.checkpoint_every, eval_k=config.eval_k,
                        eval_stride=config.eval_stride, seed=config.seed,
                        autocast=config.autocast and compute_dtype("auto", "cpu") == torch.bfloat16)
    work = out / WORK_DIR
    try:
        state = train(objective, corpus, schedule, work, config.resume, identity(config, prepared), log)
    except KeyboardInterrupt:
        log(f"interrupted: the last checkpoint is kept in {work / CHECKPOINT_FILE}; rerun with --resume to continue")
        raise
    training = training_facts(config, prepared, state, data_seconds)
    objective.export(out, model_card(training), training)
    if config.export:
        exported = export_drafter(out, config.export, export_dir(str(out), config.export), prepared.checkpoint)
        for note in exported.notes:
            log(f"converted: {note}")
        log(f"exported to {exported.out}; serve with {exported.launch}")
    return out


def training_facts(config: TrainConfig, prepared: Prepared, state: LoopState, data_seconds: float) -> dict:
    corpus = prepared.corpus
    held = corpus.split(True)
    final = state.history[-1]["acceptance"] if state.history else {}
    return {
        "kind": config.kind, "target": prepared.target_name,
        **({"aux_layers": default_aux_layers(prepared.checkpoint.config.num_hidden_layers)}
           if config.kind == "eagle3" else {}),
        "specwise_version": package_version(),
        "data": {"source": "built-in training prompts" if config.data == BUILT_IN else Path(config.data).name,
                 "prompts": sum(prepared.prompts_per_category.values()), "held_out_prompts": len(held),
                 "prompts_per_category": prepared.prompts_per_category,
                 "train_tokens": corpus.num_tokens(corpus.split(False)), "held_out_tokens": corpus.num_tokens(held),
                 **({"corpus": {"file": Path(config.corpus).name, "tokens": corpus_tokens(corpus)}}
                    if config.corpus else {})},
        "settings": {name: value for name, value in asdict(config).items()
                     if name not in ("out", "target", "data", "resume", "num_threads", "export", "corpus")},
        "steps": state.step, "wall_seconds": round(state.seconds, 1), "data_seconds": round(data_seconds, 1),
        "machine": f"{cpu_name()}, {torch.get_num_threads()} torch threads ({os.cpu_count()} cores)",
        "held_out_acceptance": final,
        "history": [{"epoch": h["epoch"], "step": h["step"],
                     "acceptance": {"all": h["acceptance"]["all"]}} for h in state.history],
    }


def corpus_tokens(corpus: Corpus) -> int:
    """Tokens of the --corpus texts (data.py's "corpus" category) in the recorded data."""
    if CORPUS_CATEGORY not in corpus.categories:
        return 0
    index = corpus.categories.index(CORPUS_CATEGORY)
    return corpus.num_tokens([s for s in range(corpus.num_seqs) if int(corpus.category[s]) == index])


def package_version() -> str:
    try:
        return importlib.metadata.version("specwise")
    except importlib.metadata.PackageNotFoundError:
        return "dev"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
