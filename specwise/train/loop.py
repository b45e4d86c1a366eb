"""The training loop: AdamW, warm-up + cosine, gradient clipping, checkpoints, `--resume`.

Everything that decides what happens next lives in the checkpoint (module, optimizer, scheduler,
the noise generator's state, the step reached, the history), and the data order is a function
of (seed, epoch) alone, so a resumed run repeats, bit for bit, what the uninterrupted one does.
A checkpoint is written to a temporary name and renamed, so an interrupted run (Ctrl-C, a killed
process) always leaves the last complete one behind.
"""

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specwise.errors import ConfigError
from specwise.train.acceptance import held_out_acceptance, summary
from specwise.train.batch import Objective, make_batch
from specwise.train.data import Corpus

CHECKPOINT_FILE = "checkpoint.pt"
SORT_WINDOW = 8                 # batches' worth of sequences sorted by length together (less padding)


@dataclass
class Schedule:
    lr: float
    weight_decay: float
    warmup_steps: int
    clip: float
    epochs: int
    batch_tokens: int
    checkpoint_every: int
    eval_k: int
    eval_stride: int
    seed: int
    autocast: bool = False


@dataclass
class LoopState:
    step: int = 0
    train_tokens: int = 0
    seconds: float = 0.0                          # training wall time so far, across resumes
    history: list[dict] = field(default_factory=list)   # one entry per finished epoch


def epoch_batches(corpus: Corpus, seqs: list[int], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """The epoch's batches, drawn from (seed, epoch): shuffled, sorted by length within windows so a
    batch pads little, packed up to batch_tokens padded tokens, then the batches shuffled."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = [seqs[i] for i in torch.randperm(len(seqs), generator=generator).tolist()]
    mean_length = max(1, corpus.num_tokens(seqs) // max(len(seqs), 1))
    window = max(1, SORT_WINDOW * batch_tokens // mean_length)
    batches = []
    for begin in range(0, len(order), window):
        current, longest = [], 0
        for seq in sorted(order[begin:begin + window], key=corpus.length):
            longest_after = max(longest, corpus.length(seq))
            if current and longest_after * (len(current) + 1) > batch_tokens:
                batches.append(current)
                current, longest_after = [], corpus.length(seq)
            current.append(seq)
            longest = longest_after
        if current:
            batches.append(current)
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def lr_factor(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def train(objective: Objective, corpus: Corpus, schedule: Schedule, work: Path, resume: bool,
          identity: dict, log: Callable[[str], None] = print) -> LoopState:
    """Train to the end of the last epoch; returns the state (history: held-out acceptance per epoch).
    `identity` (kind, data key, settings) must match a checkpoint that is resumed."""
    train_seqs, held_seqs = corpus.split(False), corpus.split(True)
    if not train_seqs:
        raise ConfigError("no training sequences: lower --held-out or give more prompts")
    plan = [epoch_batches(corpus, train_seqs, schedule.batch_tokens, schedule.seed, epoch)
            for epoch in range(schedule.epochs)]
    total_steps = sum(map(len, plan))
    params = [p for p in objective.module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=schedule.lr, weight_decay=schedule.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, schedule.warmup_steps, total_steps))
    noise = torch.Generator().manual_seed(schedule.seed + 1)
    state = LoopState()
    checkpoint_path = work / CHECKPOINT_FILE
    if resume:
        state = load_checkpoint(checkpoint_path, identity, objective, optimizer, scheduler, noise)
        log(f"resuming at step {state.step} of {total_steps}")
    work.mkdir(parents=True, exist_ok=True)
    save = lambda: save_checkpoint(checkpoint_path, identity, objective, optimizer, scheduler, noise, state)  # noqa

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[info]}"))
    with Progress(*columns) as progress:
        task = progress.add_task("training", total=total_steps, completed=state.step, info="")
        done = 0
        for epoch, batches in enumerate(plan):
            for index, seqs in enumerate(batches):
                if done + index < state.step:
                    continue
                started = time.perf_counter()
                batch = make_batch(corpus, seqs, objective.needs_features)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=schedule.autocast):
                    loss, parts = objective.loss(batch, noise)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, schedule.clip)
                optimizer.step()
                scheduler.step()
                state.step += 1
                tokens = int(batch.lengths.sum())
                state.train_tokens += tokens
                state.seconds += time.perf_counter() - started
                shown = " ".join(f"{name} {value:.3f}" for name, value in parts.items())
                progress.update(task, advance=1, description=f"epoch {epoch + 1}/{schedule.epochs}",
                                info=f"loss {loss.item():.3f} {shown} | "
                                     f"{tokens / (time.perf_counter() - started):.0f} tok/s")
                if state.step % schedule.checkpoint_every == 0:
                    save()
            done += len(batches)
            if held_seqs and len(state.history) <= epoch:
                started = time.perf_counter()
                stride = 1 if epoch + 1 == schedule.epochs else schedule.eval_stride    # the last: every position
                figures = summary(held_out_acceptance(objective, corpus, held_seqs, schedule.eval_k, stride))
                state.seconds += time.perf_counter() - started
                state.history.append({"epoch": epoch + 1, "step": state.step, "acceptance": figures})
                line = ", ".join(f"{name} {f['mean_acceptance_length']:.2f}" for name, f in figures.items())
                progress.console.print(f"epoch {epoch + 1}: held-out mean acceptance length at k={schedule.eval_k}: "
                                       f"{line}")
            save()
    return state


def save_checkpoint(path: Path, identity: dict, objective: Objective, optimizer, scheduler,
                    noise: torch.Generator, state: LoopState) -> None:
    payload = {"identity": identity, "module": objective.module.state_dict(), "optimizer": optimizer.state_dict(),
               "scheduler": scheduler.state_dict(), "noise": noise.get_state(), "state": vars(state)}
    partial = path.with_name(path.name + ".partial")
    torch.save(payload, partial)
    partial.replace(path)


def load_checkpoint(path: Path, identity: dict, objective: Objective, optimizer, scheduler,
                    noise: torch.Generator) -> LoopState:
    if not path.is_file():
        raise ConfigError(f"{path}: no checkpoint to resume from (run without --resume to start)")
    try:
        payload = torch.load(path, weights_only=False)
    except Exception as e:                         # torch raises many kinds for a damaged file
        raise ConfigError(f"{path}: cannot read the checkpoint ({type(e).__name__}); start again without "
                          f"--resume") from None
    saved = payload.get("identity", {})
    for name, value in identity.items():
        if saved.get(name) != value:
            raise ConfigError(f"{path}: the checkpoint was trained with {name} = {saved.get(name)!r}, this run "
                              f"has {value!r}; resume with the same settings or use another --out")
    objective.module.load_state_dict(payload["module"])
    optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    noise.set_state(payload["noise"])
    return LoopState(**payload["state"])
