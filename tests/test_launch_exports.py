"""`evaluate --engine vllm --methods eagle:DIR,medusa:DIR` with our own heads: exported to vLLM's format
before any server starts, launched with the export (the fake engine, tests/fake_engine.py), shown by
--dry-run without writing anything; where the export goes is decided per arm (bench/launch/exports.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specwise.bench.config import EvaluateConfig
from specwise.bench.evaluate import evaluate
from specwise.bench.launch import exports
from specwise.bench.launch.pool import LaunchSettings
from specwise.bench.load.arms import parse_engine_methods
from specwise.bench.results import read_records
from specwise.errors import ConfigError
from specwise.models.checkpoints.loader import build_model
from specwise.models.export.vllm_eagle import read_eagle
from specwise.models.export.vllm_eagle3 import read_eagle3
from specwise.models.export.vllm_medusa import read_medusa
from specwise.models.heads.builtin import PACKAGE_HEADS
from draft_dirs import write_first_layers_draft
from head_training import fitted_head_dir, greedy_texts
from tiny_models import tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]
FAKE = f"{sys.executable} {ROOT / 'tests' / 'fake_engine.py'} serve"
DEADLINE = 60.0


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """A tiny target as an HF directory (what --model names) and an EAGLE and a Medusa head trained on its
    greedy text for a few steps."""
    root = tmp_path_factory.mktemp("heads")
    target = tiny_checkpoint()
    model = build_model(target, torch.float32, "cpu", 64, plain=True)     # trains heads
    texts = greedy_texts(model, [[1, 5, 9, 17], [1, 40, 41]], max_tokens=12)
    hf = write_first_layers_draft(target, target.config.num_hidden_layers, root / "target")
    eagle = fitted_head_dir(root / "eagle", "eagle", target, model, texts, steps=10)
    medusa = fitted_head_dir(root / "medusa", "medusa", target, model, texts, steps=10, num_heads=2)
    eagle3 = fitted_head_dir(root / "eagle3", "eagle3", target, model, texts, steps=10)
    return hf, eagle, medusa, eagle3


def run_config(tmp_path, methods: str) -> EvaluateConfig:
    return EvaluateConfig(methods=methods, concurrency="1", num_requests=2, max_tokens=6, per_category=1, warmup=1,
                          progress=False, settle=0.0, output=str(tmp_path / "results"))


def settings(model, **overrides) -> LaunchSettings:
    values = dict(engine="vllm", model=str(model), engine_cmd=FAKE, start_timeout=DEADLINE, pairing="side-by-side")
    values.update(overrides)
    return LaunchSettings(**values)


def copy_head(source: Path, directory: Path) -> Path:
    directory.mkdir()
    for name in ("drafter.json", "model.safetensors"):
        (directory / name).write_bytes((source / name).read_bytes())
    return directory


def test_heads_are_exported_beside_them_and_launched_with_the_export(tmp_path, fake, heads):
    hf, eagle_source, medusa_source, _ = heads
    eagle, medusa = copy_head(eagle_source, tmp_path / "eagle"), copy_head(medusa_source, tmp_path / "medusa")
    outcome = evaluate(run_config(tmp_path, f"off,eagle:{eagle}@2,medusa:{medusa}@2"), argv=[], launch=settings(hf))
    run = json.loads((outcome.results_dir / "run.json").read_text())
    configs = {server["arm"]: server["argv"] for server in run["launch"]["servers"]}
    eagle_config = json.loads(configs["eagle-eagle-k2"][configs["eagle-eagle-k2"].index("--speculative-config") + 1])
    medusa_config = json.loads(configs["medusa-medusa-k2"][configs["medusa-medusa-k2"].index("--speculative-config")
                                                           + 1])
    assert eagle_config == {"method": "eagle", "model": str(eagle / "export-vllm"), "num_speculative_tokens": 2}
    assert medusa_config == {"method": "medusa", "model": str(medusa / "export-vllm"), "num_speculative_tokens": 2}
    assert read_eagle(eagle / "export-vllm")[0]["architectures"] == ["EagleMistralForCausalLM"]
    assert read_medusa(medusa / "export-vllm")[0]["num_heads"] == 2
    assert [(e["arm"], e["reuse"]) for e in run["launch"]["exports"]] == [("eagle-eagle-k2", False),
                                                                          ("medusa-medusa-k2", False)]
    records = [r for r in read_records(outcome.results_dir) if not r.warmup]
    assert {r.arm for r in records} == {"off", "eagle-eagle-k2", "medusa-medusa-k2"}
    assert not any(r.error for r in records)
    # the run's arms (what the recommendation reads) name the export, a checkpoint in vLLM's format
    assert {arm["name"]: arm["spec"] for arm in run["arms"]}["eagle-eagle-k2"] == f"eagle:{eagle / 'export-vllm'}"
    configs = {config["spec"]: config for config in json.loads((outcome.results_dir / "summary.json").read_text())
               ["recommendation"]["configs"]}
    exported = configs[f"eagle:{eagle / 'export-vllm'}"]
    assert exported["vllm"]["model"] == str(eagle / "export-vllm") and "Export the head" not in exported["vllm_note"]
    assert exported["sglang"] is None and "no final norm" in exported["sglang_note"]   # vLLM's format only

    again = evaluate(run_config(tmp_path / "second", f"off,eagle:{eagle}@2"), argv=[], launch=settings(hf))
    second = json.loads((again.results_dir / "run.json").read_text())["launch"]["exports"]
    assert [(e["out"], e["reuse"]) for e in second] == [(str(eagle / "export-vllm"), True)]


def test_dry_run_shows_the_export_and_writes_nothing(tmp_path, fake, heads):
    hf, eagle_source, _, _ = heads
    eagle = copy_head(eagle_source, tmp_path / "eagle")
    result = subprocess.run(
        [sys.executable, "-m", "specwise", "evaluate", "--engine", "vllm", "--engine-cmd", FAKE, "--model", str(hf),
         "--methods", f"off,eagle:{eagle}@3", "--output", str(tmp_path / "results"), "--dry-run"],
        cwd=ROOT, capture_output=True, text=True, timeout=DEADLINE)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == (f"export eagle-eagle-k3: specwise export-drafter {eagle} --format vllm --out "
                        f"{eagle / 'export-vllm'} (where the recommendation points)")
    assert [line.split(":")[0] for line in lines[1:]] == ["off", "eagle-eagle-k3"]
    assert f'"model": "{eagle / "export-vllm"}"' in lines[2]
    assert not (eagle / "export-vllm").exists() and not (tmp_path / "results").exists()
    assert not list(fake.glob("*.pid"))


def test_where_each_export_goes(tmp_path, heads, monkeypatch):
    _, eagle_source, _, _ = heads
    results = tmp_path / "results"

    def planned(directory):
        specs = parse_engine_methods(f"eagle:{directory}@4", "vllm", 4)
        return exports.plan_exports(specs, "vllm", results)[0]

    shipped = planned(PACKAGE_HEADS / "smollm2-135m-instruct" / "eagle")     # never written into the package
    assert shipped.out == str(results / "exports" / "eagle-eagle-k4") and "specwise package" in shipped.why
    stale = copy_head(eagle_source, tmp_path / "stale")
    (stale / "export-vllm").mkdir()                                           # incomplete: no files
    assert planned(stale).out == str(results / "exports" / "eagle-stale-k4")
    monkeypatch.setattr(exports.os, "access", lambda path, mode: False)
    locked = copy_head(eagle_source, tmp_path / "locked")
    assert "not writable" in planned(locked).why
    assert exports.plan_exports(parse_engine_methods("off,eagle:/servers/ckpt@4", "vllm", 4), "vllm", results) == []


def test_sglang_cannot_hold_our_eagle_head_one_line_before_anything_starts(tmp_path, fake, heads):
    hf, eagle_source, _, _ = heads
    eagle = copy_head(eagle_source, tmp_path / "eagle")
    with pytest.raises(ConfigError, match="cannot export this eagle drafter for SGLang") as error:
        evaluate(run_config(tmp_path, f"off,eagle:{eagle}"), argv=[],
                 launch=settings(hf, engine="sglang", engine_cmd=FAKE.removesuffix(" serve")))
    assert "\n" not in str(error.value) and not (eagle / "export-sglang").exists()
    assert not list(fake.glob("*.pid"))


def test_an_eagle3_head_is_exported_as_vllm_eagle3_and_launched(tmp_path, fake, heads):
    hf, _, _, eagle3_source = heads
    eagle3 = copy_head(eagle3_source, tmp_path / "eagle3")
    outcome = evaluate(run_config(tmp_path, f"off,eagle3:{eagle3}@3"), argv=[], launch=settings(hf))
    run = json.loads((outcome.results_dir / "run.json").read_text())
    argv = run["launch"]["servers"][1]["argv"]
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config == {"method": "eagle3", "model": str(eagle3 / "export-vllm"), "num_speculative_tokens": 3}
    assert read_eagle3(eagle3 / "export-vllm")[0]["architectures"] == ["Eagle3LlamaForCausalLM"]
    assert not any(r.error for r in read_records(outcome.results_dir))
