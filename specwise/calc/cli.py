"""`specwise calc {speedup,latency,throughput,catalog}`, and the helpers `specwise simulate` shares
(the step-cost source, the rich tables)."""

import argparse

from rich.console import Console
from rich.table import Table

from specwise.calc.catalog import gpu_names, get_gpu, get_model, model_names
from specwise.calc.deployment import Deployment, DeploymentConfig
from specwise.calc.latency import LatencyConfig, estimate_latency
from specwise.calc.roofline import RooflineCost
from specwise.calc.speedup import SpeedupConfig, best_row, minimum_alpha, speedup_table
from specwise.calc.throughput import (ThroughputConfig, batch_grid, describe_switches, max_batch, switches,
                                      throughput_table)
from specwise.cli_args import add_dataclass_args, dataclass_from_args
from specwise.engine.cost.step_profile import load_step_cost


def register(subparsers) -> None:
    calc = subparsers.add_parser("calc", help="speculative decoding speedup, latency and throughput calculators",
                                 description="Answers on paper, for any GPU and model in the catalog or your own.")
    calculators = calc.add_subparsers(dest="calculator", required=True)
    _add(calculators, "speedup", _speedup, "expected tokens per step, speedup and best k at batch size 1",
         SpeedupConfig)
    _add(calculators, "latency", _latency, "TTFT, TPOT and end-to-end latency, and whether it fits in memory",
         DeploymentConfig, LatencyConfig, profile=True)
    _add(calculators, "throughput", _throughput, "tokens/s against batch size with and without speculation",
         DeploymentConfig, ThroughputConfig, profile=True)
    _add(calculators, "catalog", _catalog, "the GPUs and models in the catalog, with sources")


def _add(subparsers, name, handler, help_text, *configs, profile=False):
    parser = subparsers.add_parser(name, help=help_text, description=help_text)
    for config in configs:
        add_dataclass_args(parser, config)
    if profile:
        add_profile_arg(parser)
    parser.set_defaults(handler=handler)


def add_profile_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default=None,
                        help="measured step-time profile JSON (see specwise/engine/cost/step_profile.py) "
                             "instead of the roofline")


def target_cost(args, deployment: Deployment):
    return load_step_cost(args.profile) if args.profile else RooflineCost(deployment)


def console() -> Console:
    return Console()


def table(title: str, *columns: str) -> Table:
    result = Table(title=title, title_justify="left")
    for index, column in enumerate(columns):
        result.add_column(column, justify="left" if index == 0 else "right")
    return result


def _speedup(args) -> int:
    config = dataclass_from_args(SpeedupConfig, args)
    acceptance = config.acceptance()
    rows = speedup_table(acceptance, config.k_max, config.draft_cost, config.overhead, config.verify_cost)
    best = best_row(rows)
    chosen = next((row for row in rows if row.k == config.k), best)
    out = table(f"Speculative decoding at batch size 1 ({acceptance.describe()}, draft cost {config.draft_cost:g})",
                "k", "tokens/step", "acceptance rate", "cost (target steps)", "speedup", "loses below alpha")
    for row in rows:
        mark = " *" if row.k == best.k else ""
        loses = "never pays" if row.breakeven_alpha is None else f"{row.breakeven_alpha:.3f}"
        out.add_row(f"{row.k}{mark}", f"{row.tokens_per_step:.3f}", f"{row.acceptance_rate:.3f}",
                    f"{row.relative_cost:.3f}", f"{row.speedup:.3f}x", loses)
    view = console()
    view.print(out)
    view.print(f"best k = {best.k} ({best.speedup:.2f}x); at k = {chosen.k}: {chosen.speedup:.2f}x, "
               f"{chosen.tokens_per_step:.2f} tokens per step")
    floor = minimum_alpha(config.k_max, config.draft_cost, config.overhead, config.verify_cost)
    view.print("no k up to k_max pays at any alpha" if floor is None else
               f"below alpha = {floor:.3f} no k up to {config.k_max} pays")
    return 0


def _latency(args) -> int:
    deployment = Deployment.from_config(dataclass_from_args(DeploymentConfig, args))
    config = dataclass_from_args(LatencyConfig, args)
    cost = target_cost(args, deployment)
    result = estimate_latency(cost, deployment, config)
    view = console()
    out = table(f"{deployment.label()}: {config.batch_size} x ({config.prompt_tokens} prompt + "
                f"{config.output_tokens} output tokens)", "figure", "value")
    out.add_row("TTFT (prefill)", _ms(result.ttft_s) + _bound(result.prefill_bound))
    out.add_row("TPOT (per output token)", _ms(result.tpot_s) + _bound(result.decode_bound))
    out.add_row("end to end", _ms(result.e2e_s))
    out.add_row("tokens/s per sequence", f"{result.tokens_per_s:,.1f}")
    out.add_row("tokens/s, whole batch", f"{result.tokens_per_s * config.batch_size:,.1f}")
    memory = result.memory
    out.add_row("weights per GPU", f"{memory.weight_bytes_per_gpu / 2**30:,.1f} GiB of "
                                   f"{memory.usable_bytes_per_gpu / 2**30:,.1f} usable")
    out.add_row("KV cache per token", f"{memory.kv_bytes_per_token / 1024:,.1f} KiB")
    out.add_row("KV capacity", f"{memory.kv_capacity_tokens:,} tokens")
    out.add_row("this batch needs", f"{result.kv_tokens_needed:,} tokens: "
                                    f"{'fits' if result.fits else 'DOES NOT FIT'}")
    view.print(out)
    view.print(f"step costs: {cost.description}")
    return 0


def _throughput(args) -> int:
    deployment = Deployment.from_config(dataclass_from_args(DeploymentConfig, args))
    config = dataclass_from_args(ThroughputConfig, args)
    cost = target_cost(args, deployment)
    arm = config.arm(cost, deployment)
    context = config.prompt_tokens + config.output_tokens / 2
    limit = max_batch(deployment, arm, config.prompt_tokens, config.output_tokens, config.max_num_seqs)
    sizes = config.batch_list() or batch_grid(max(limit, 1))
    rows = throughput_table(cost, arm, context, sizes)
    out = table(f"{deployment.label()}, context {context:g} tokens; {arm.name} "
                f"({arm.acceptance['*'].describe()}, {arm.draft.description})",
                "batch", "off tok/s", "spec tok/s", "spec / off", "off step", "spec step", "plain step is")
    for row in rows:
        flag = "" if row.batch_size <= limit else " (over KV)"
        out.add_row(f"{row.batch_size}{flag}", f"{row.off_tokens_per_s:,.0f}", f"{row.spec_tokens_per_s:,.0f}",
                    f"{row.ratio:.2f}x", _ms(row.off_step_s), _ms(row.spec_step_s), row.bound or "")
    view = console()
    view.print(out)
    view.print(f"KV cache holds {limit} sequences of {config.prompt_tokens} + {config.output_tokens} tokens")
    view.print(describe_switches(rows, switches(cost, arm, context, rows)))
    return 0


def _catalog(args) -> int:
    view = console()
    gpus = table("GPUs (dense tensor-core peaks)", "name", "memory GB", "GB/s", "BF16 TFLOP/s", "FP8 TFLOP/s",
                 "link GB/s")
    gpus.columns[0].no_wrap = True
    for name in gpu_names():
        gpu = get_gpu(name)
        gpus.add_row(name, f"{gpu.memory_gb:g}", f"{gpu.bandwidth_gbs:,.0f}", f"{gpu.bf16_tflops:,.1f}",
                     "-" if gpu.fp8_tflops is None else f"{gpu.fp8_tflops:,.1f}", f"{gpu.interconnect_gbs:,.0f}")
    models = table("Models", "name", "layers", "hidden", "heads", "KV heads", "head dim", "vocab", "params")
    models.columns[0].no_wrap = True
    for name in model_names():
        model = get_model(name)
        models.add_row(name, str(model.num_layers), str(model.hidden_size), str(model.num_heads),
                       str(model.num_kv_heads), str(model.head_dim), f"{model.vocab_size:,}",
                       f"{model.num_parameters / 1e9:.2f}B")
    view.print(gpus)
    view.print(models)
    view.print("Sources:")
    for name in gpu_names():
        view.print(f"  {name}: {get_gpu(name).source}", soft_wrap=True)
    for name in model_names():
        view.print(f"  {name}: {get_model(name).source}", soft_wrap=True)
    return 0


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms"


def _bound(bound: str | None) -> str:
    return f" ({bound}-bound)" if bound else ""
