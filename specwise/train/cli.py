"""`specwise train-drafter`: distil a drafter (EAGLE head, Medusa heads or a small draft model) from a target."""

import argparse

from specwise.cli_args import add_dataclass_args, dataclass_from_args
from specwise.train.config import TrainConfig


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "train-drafter", help="train a drafter for a target by self-distillation",
        description="Generate the target's own responses to a prompt set, record its features, train a drafter "
                    "on them and write it to --out (safetensors weights, config, model card), ready for "
                    "--speculative eagle:DIR, medusa:DIR or draft:DIR.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_dataclass_args(parser, TrainConfig)
    parser.set_defaults(handler=run_train)


def run_train(args: argparse.Namespace) -> int:
    config = dataclass_from_args(TrainConfig, args)      # bad flags fail before the model loads
    from specwise.train.run import run                    # torch (~3 s): only when a drafter is trained
    out = run(config)
    print(f"wrote {out}")
    return 0
