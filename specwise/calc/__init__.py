"""Calculators that answer on paper: does speculative decoding pay on this GPU, for this model
and drafter, at this concurrency? (docs/calculators.md explains the model; the simulator,
`specwise simulate`, is specwise/sim and builds on these.)

    catalog      GPUSpec, ModelSpec, get_gpu, get_model        spec-sheet figures with sources
    deployment   DeploymentConfig, Deployment, MemoryPlan      a model on tp GPUs; does it fit
    roofline     RooflineCost                                  seconds per forward pass, from catalog figures
    acceptance   Acceptance, expected_tokens_per_step          i.i.d. alpha or per-position rates
    speedup      speedup_table, breakeven_alpha                `specwise calc speedup`
    latency      estimate_latency                              `specwise calc latency`
    throughput   throughput_table, switches                    `specwise calc throughput`
    arms         parse_arm, SpecArm                            speculation configurations

Names are importable from here too (loaded on first use, so `specwise.calc` stays quick).
"""

import importlib

_EXPORTS = {
    "catalog": ("GPUSpec", "ModelSpec", "get_gpu", "get_model"),
    "deployment": ("DeploymentConfig", "Deployment", "MemoryPlan"),
    "roofline": ("RooflineCost",),
    "acceptance": ("Acceptance", "expected_tokens_per_step"),
    "speedup": ("speedup_table", "breakeven_alpha"),
    "latency": ("estimate_latency",),
    "throughput": ("throughput_table", "switches"),
    "arms": ("parse_arm", "SpecArm"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name):
    if name not in _MODULE_OF:
        raise AttributeError(name)
    return getattr(importlib.import_module(f"specwise.calc.{_MODULE_OF[name]}"), name)
