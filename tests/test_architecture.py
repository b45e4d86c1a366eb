"""The package's shape: imports run one way (interfaces -> engine -> models), with no cycles.

Every import statement counts, function-local and TYPE_CHECKING ones included, so a
cycle cannot hide inside a function. See docs/design.md, "Architecture".
"""

import argparse
import ast
import subprocess
import sys
from pathlib import Path

import specwise
from specwise.cli import build_parser

PACKAGE = Path(specwise.__file__).parent
INTERFACES = ("bench", "server", "sim", "calc", "monitor", "train", "cli", "engine_cli", "cli_args")
LOWER_LAYERS = {"engine": INTERFACES, "models": INTERFACES + ("engine",)}


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the specwise modules it imports (`from a import b` counts a.b when b is a module)."""
    modules = {module_name(path, package): path for path in package.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")[: len(name.split(".")) - node.level + is_package]
                    base = ".".join(anchor + ([base] if base else []))
                imported.add(base)
                imported.update(f"{base}.{alias.name}" for alias in node.names)
        graph[name] = {target for target in imported if target in modules and target != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, targets in graph.items():
        layer = module.split(".")[1] if module.count(".") else ""
        for target in targets:
            room = target.split(".")[1] if target.count(".") else ""
            if room in LOWER_LAYERS.get(layer, ()):
                wrong.append(f"{module} imports {target}")
    return sorted(wrong)


def test_engine_and_models_import_nothing_above_them():
    assert layer_violations(import_graph()) == []


def test_no_import_cycles():
    assert find_cycle(import_graph()) is None


def test_the_checks_catch_what_they_look_for():
    graph = {"specwise.engine.a": {"specwise.bench.x"}, "specwise.models.m": {"specwise.engine.a"},
             "specwise.bench.x": {"specwise.bench.y"}, "specwise.bench.y": {"specwise.bench.x"}}
    assert layer_violations(graph) == ["specwise.engine.a imports specwise.bench.x",
                                       "specwise.models.m imports specwise.engine.a"]
    assert find_cycle(graph) == ["specwise.bench.x", "specwise.bench.y", "specwise.bench.x"]


def test_the_graph_sees_function_local_and_relative_imports(tmp_path):
    package = tmp_path / "specwise"
    (package / "engine").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "engine" / "__init__.py").write_text("from . import runner\n")
    (package / "engine" / "runner.py").write_text("def run():\n    from specwise.engine import policy\n")
    (package / "engine" / "policy.py").write_text("from .runner import run\n")
    graph = import_graph(package)
    assert graph["specwise.engine"] == {"specwise.engine.runner"}
    assert graph["specwise.engine.runner"] == {"specwise.engine", "specwise.engine.policy"}
    assert graph["specwise.engine.policy"] == {"specwise.engine.runner"}


def test_python_dash_m_runs_the_command():
    result = subprocess.run([sys.executable, "-m", "specwise", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "evaluate" in result.stdout and "simulate" in result.stdout


def test_nothing_imports_the_training_package():
    """specwise.train is reached only through the command table (cli.py names it as a string)."""
    graph = import_graph()
    importers = sorted(module for module, targets in graph.items() if not module.startswith("specwise.train")
                       and any(target.startswith("specwise.train") for target in targets))
    assert importers == []


def subcommand_parsers(parser: argparse.ArgumentParser, path=()):
    """Every (path, parser) under `parser`, nested subcommands included."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from subcommand_parsers(child, path + (name,))


def test_every_subcommand_renders_its_help():
    # argparse formats help text lazily: a bare "%" in one flag's help raises only when that
    # subcommand's --help is asked for
    parsers = list(subcommand_parsers(build_parser()))
    assert {"evaluate", "simulate", "calibrate", "serve"} <= {path[0] for path, _ in parsers if path}
    for path, parser in parsers:
        text = parser.format_help()
        assert text.startswith("usage: specwise"), path
