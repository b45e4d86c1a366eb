"""Build argparse flags from dataclass fields, and dataclasses back from parsed flags.

One definition per setting: `EngineConfig.max_num_seqs` becomes `--max-num-seqs`,
with the field's default and its metadata["help"].
"""

import argparse
import dataclasses
import types
import typing


def _base_type(annotation):
    """`int | None` -> int, `list[str]` -> (list, str)."""
    if isinstance(annotation, str):
        annotation = eval(annotation, {"list": list, "None": None})
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _base_type(inner[0])
    if origin is list:
        return (list, typing.get_args(annotation)[0])
    return annotation


def add_dataclass_args(parser: argparse.ArgumentParser, cls, exclude=(), prefix="", defaults=None):
    """defaults: {field: value} for this command only (e.g. `serve` compiles by default), shown in --help."""
    hints = typing.get_type_hints(cls)
    defaults = defaults or {}
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        flag = "--" + prefix + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        kind = _base_type(hints[f.name])
        dest = prefix.replace("-", "_") + f.name
        if f.name in defaults:
            parser.set_defaults(**{dest: defaults[f.name]})
        default = defaults.get(f.name, None if f.default is dataclasses.MISSING else f.default)
        if kind is bool:
            parser.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=f"{help_text} (default: {default})")
        elif isinstance(kind, tuple):
            parser.add_argument(flag, dest=dest, type=kind[1], action="append", default=argparse.SUPPRESS,
                                help=f"{help_text} (repeatable)")
        else:
            parser.add_argument(flag, dest=dest, type=kind, default=argparse.SUPPRESS,
                                help=f"{help_text} (default: {default})")


def dataclass_from_args(cls, args: argparse.Namespace, prefix="", **overrides):
    """Fields given on the command line override the dataclass defaults."""
    given = vars(args)
    values = {}
    for f in dataclasses.fields(cls):
        key = prefix.replace("-", "_") + f.name
        if key in given:
            values[f.name] = given[key]
    values.update(overrides)
    return cls(**values)
