"""`specwise train-drafter`: distil a drafter (EAGLE head, Medusa heads or a small draft model) from a target;
`specwise export-drafter`: write one in a serving engine's checkpoint format."""

import argparse

from specwise.cli_args import add_dataclass_args, dataclass_from_args
from specwise.train.config import ExportConfig, TrainConfig


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "train-drafter", help="train a drafter for a target by self-distillation",
        description="Generate the target's own responses to a prompt set, record its features, train a drafter "
                    "on them and write it to --out (safetensors weights, config, model card), ready for "
                    "--speculative eagle:DIR, medusa:DIR or draft:DIR.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_dataclass_args(parser, TrainConfig)
    parser.set_defaults(handler=run_train)

    parser = subparsers.add_parser(
        "export-drafter", help="write a trained drafter in vLLM's or SGLang's checkpoint format",
        description="Write a drafter directory (EAGLE or Medusa heads, or a distilled draft model) as the engine "
                    "loads it: its config, weight names and layouts, draft vocabulary where the format has one, "
                    "and a model card. What the format cannot hold is converted (said on stdout) or refused.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("drafter", help=ExportConfig.__dataclass_fields__["drafter"].metadata["help"])
    add_dataclass_args(parser, ExportConfig, exclude=("drafter",))
    parser.set_defaults(handler=run_export)


def run_train(args: argparse.Namespace) -> int:
    config = dataclass_from_args(TrainConfig, args)      # bad flags fail before the model loads
    from specwise.train.run import run                    # torch (~3 s): only when a drafter is trained
    out = run(config)
    print(f"wrote {out}")
    return 0


def run_export(args: argparse.Namespace) -> int:
    config = dataclass_from_args(ExportConfig, args)
    from specwise.models.export.drafter_export import check_export, export_drafter   # torch: only when exporting
    from specwise.models.checkpoints.loader import load_checkpoint
    check_export(config.drafter, config.format, config.out)       # a bad directory fails before the target loads
    export = export_drafter(config.drafter, config.format, config.out, load_checkpoint(config.target))
    for note in export.notes:
        print(f"converted: {note}")
    print(f"wrote {export.out} ({export.kind}, {config.format}); serve with {export.launch}")
    return 0
