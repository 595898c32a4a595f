"""The KV capacity model: how many concurrent requests a card carries, why, and what each fix buys.

Pure core (every module but one: ``architecture``, ``kv``, ``memory``, ``planner``, ``whatif``, ``findings``,
``rules`` and the rest) plus ``presets``, which reads the files:
the packaged ones in ``kvwatch/data`` and a user's ``config.json``; the sidecar's use of it lives in
:mod:`kvwatch.serve`. See docs/capacity.md.
"""

from kvwatch.capacity.architecture import ArchitectureError, ModelArch, arch_from_config
from kvwatch.capacity.memory import QuantizationError
from kvwatch.capacity.planner import (
    CapacityPlan,
    DeploymentSpec,
    SpecError,
    default_gpu_memory_utilization,
    parse_version,
    plan_capacity,
)
from kvwatch.capacity.presets import GpuPreset, PresetError, match_model, resolve_gpu, resolve_model
from kvwatch.capacity.units import parse_bytes
from kvwatch.capacity.whatif import Scenario, whatif_ceilings, whatif_scenarios

__all__ = [
    "ArchitectureError",
    "CapacityPlan",
    "DeploymentSpec",
    "GpuPreset",
    "ModelArch",
    "PresetError",
    "QuantizationError",
    "Scenario",
    "SpecError",
    "arch_from_config",
    "default_gpu_memory_utilization",
    "match_model",
    "parse_bytes",
    "parse_version",
    "plan_capacity",
    "resolve_gpu",
    "resolve_model",
    "whatif_ceilings",
    "whatif_scenarios",
]
