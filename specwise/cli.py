"""`specwise` command: one subcommand module per room, each with `register(subparsers)`."""

import argparse
import importlib
import sys

from specwise.errors import SpecwiseError

ROOMS = [
    "specwise.engine_cli",
    "specwise.server.cli",
    "specwise.bench.cli",
    "specwise.calc.cli",
    "specwise.sim.cli",
    "specwise.monitor.cli",
    "specwise.train.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specwise",
        description="Does speculative decoding pay for your workload, at your concurrency?")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for room in ROOMS:
        importlib.import_module(room).register(subparsers)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args) or 0
    except SpecwiseError as error:
        print(f"specwise: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specwise: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
