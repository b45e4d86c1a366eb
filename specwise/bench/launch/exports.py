"""Engine arms that name our own heads (`--engine vllm --methods eagle:DIR,medusa:DIR`, DIR holding a
drafter.json): each head is exported to the engine's checkpoint format before any server starts, and
the arm is launched (and recommended) with the export, a checkpoint in the server's format.

Where the export goes, decided per arm:
  DIR/export-FORMAT      reused when it is already there and newer than the head (train-drafter --export
                         or export-drafter wrote it); written there when absent and DIR is writable, so the
                         recommendation's `"model": DIR/export-vllm` exists after the run
  RESULTS/exports/ARM    otherwise: DIR not writable, inside the installed specwise package (the shipped
                         heads: a measurement never writes into the package), or its export-FORMAT stale
A directory without drafter.json is taken as the server's own checkpoint, as it is.

Worked example: `--methods off,eagle:runs/eagle@4` with runs/eagle writable and no runs/eagle/export-vllm
-> `specwise export-drafter runs/eagle --format vllm --out runs/eagle/export-vllm` (the target: --model),
then the arm eagle-eagle-k4 runs `--speculative-config '{"method": "eagle", "model": "runs/eagle/export-vllm",
...}'`. `--dry-run` prints the export line and writes nothing.
"""

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import specwise
from specwise.bench.engine_flags import HEADS
from specwise.bench.load.arms import ArmSpec
from specwise.models.export.export_formats import export_dir, is_specwise_drafter

PACKAGE = Path(specwise.__file__).resolve().parent
SOURCE_FILES = ("drafter.json", "model.safetensors")      # an export older than these is stale
EXPORT_FILES = ("config.json", "model.safetensors")       # what a complete export holds


@dataclass
class HeadExport:
    arm: str
    drafter: str                # DIR as given in --methods
    out: str                    # the export the server loads
    format: str                 # the engine's checkpoint format: vllm, sglang
    reuse: bool                 # out is already there and up to date
    why: str                    # where out is, and why there
    notes: list[str] = field(default_factory=list)      # conversions export-drafter made

    def text(self) -> str:
        """The line --dry-run prints (and the console before the servers start)."""
        if self.reuse:
            return f"export {self.arm}: reuse {self.out} ({self.why})"
        return (f"export {self.arm}: specwise export-drafter {self.drafter} --format {self.format} --out {self.out} "
                f"({self.why})")


def plan_exports(specs: list[ArmSpec], engine: str, results_dir: Path) -> list[HeadExport]:
    """One HeadExport per arm naming a specwise head; nothing is read beyond the directories' listings."""
    plans = []
    for spec in specs:
        directory = (spec.spec or "").partition(":")[2].strip()
        if spec.method not in HEADS or not directory or not is_specwise_drafter(directory):
            continue
        plans.append(_where(spec.name, directory, engine, results_dir))
    return plans


def _where(arm: str, directory: str, engine: str, results_dir: Path) -> HeadExport:
    beside = Path(export_dir(directory, engine)).expanduser()
    fallback = str(results_dir / "exports" / arm)
    if beside.exists():
        if _up_to_date(Path(directory).expanduser(), beside):
            return HeadExport(arm, directory, str(beside), engine, True, "already exported, newer than the head")
        return HeadExport(arm, directory, fallback, engine, False, f"{beside} is older than the head or incomplete")
    source = Path(directory).expanduser().resolve()
    if source.is_relative_to(PACKAGE):
        return HeadExport(arm, directory, fallback, engine, False,
                          "a head inside the specwise package: never written to")
    if not os.access(source, os.W_OK):
        return HeadExport(arm, directory, fallback, engine, False, f"{directory} is not writable")
    return HeadExport(arm, directory, str(beside), engine, False, "where the recommendation points")


def _up_to_date(source: Path, export: Path) -> bool:
    if not all((export / name).is_file() for name in EXPORT_FILES):
        return False
    newest_source = max((source / name).stat().st_mtime for name in SOURCE_FILES if (source / name).exists())
    return min((export / name).stat().st_mtime for name in EXPORT_FILES) >= newest_source


def check_exports(plans: list[HeadExport]) -> None:
    """What needs no target: a drafter the engine's format cannot hold, an occupied --out (ConfigError)."""
    from specwise.models.export.drafter_export import check_export      # torch: only when an arm names our head
    for plan in plans:
        if not plan.reuse:
            check_export(plan.drafter, plan.format, plan.out)


def run_exports(plans: list[HeadExport], model: str) -> None:
    """Write the exports that are not reused, the target (--model) loaded once for all of them."""
    pending = [plan for plan in plans if not plan.reuse]
    if not pending:
        return
    from specwise.models.export.drafter_export import export_drafter      # torch: only when a head is exported
    from specwise.models.checkpoints.loader import load_checkpoint
    target = load_checkpoint(model)
    for plan in pending:
        plan.notes = export_drafter(plan.drafter, plan.format, plan.out, target).notes


def exported_specs(specs: list[ArmSpec], plans: list[HeadExport]) -> list[ArmSpec]:
    """The arms with each head's spec pointing at its export (method and k kept, the name too)."""
    plans_by_arm = {plan.arm: plan for plan in plans}
    return [dataclasses.replace(spec, spec=f"{spec.method}:{plans_by_arm[spec.name].out}",
                                exported_from=plans_by_arm[spec.name].drafter)
            if spec.name in plans_by_arm else spec for spec in specs]
