"""What ``serve`` needs from the capacity model: built once at startup, asked once per poll.

``build_sidecar_capacity`` resolves the model (``--model``/``--model-config``, else vLLM's ``model_name``
label when a preset matches) and the GPU; it never raises for a missing or unknown model/GPU, it returns
``None`` with the reason to log, so the sidecar keeps running and simply omits the formula metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvwatch.capacity.architecture import ArchitectureError
from kvwatch.capacity.memory import QuantizationError
from kvwatch.capacity.planner import CapacityPlan, DeploymentSpec, SpecError, plan_capacity
from kvwatch.capacity.presets import PresetError
from kvwatch.capacity.whatif import Scenario, whatif_ceilings, whatif_scenarios


@dataclass(frozen=True)
class SidecarCapacity:
    plan: CapacityPlan
    scenarios: tuple[Scenario, ...]

    @property
    def formula_kv_capacity_tokens(self) -> int:
        """``kvwatch_formula_kv_capacity_tokens``: the formula's figure, beside vLLM's reported one."""
        return self.plan.kv_cache_tokens

    def whatif_max_concurrency(self, avg_kv_tokens_per_request: float) -> dict[str, float]:
        """``kvwatch_whatif_max_concurrency{scenario}`` at the live average KV tokens per running request."""
        return whatif_ceilings(self.scenarios, avg_kv_tokens_per_request)


def build_sidecar_capacity(settings: Any, model_name: str | None = None,
                           **overrides: Any) -> tuple[SidecarCapacity | None, str]:
    """(capacity, "") when the model and the deployment are known, else (None, why)."""
    if settings.model is None and settings.model_config_path is None:
        if not model_name:
            return None, "model unknown: pass --model or --model-config"
        settings = settings.model_copy(update={"model": model_name})
    try:
        spec = DeploymentSpec.from_settings(settings, **overrides)
        plan = plan_capacity(spec)
        scenarios = tuple(whatif_scenarios(spec))
    except (PresetError, ArchitectureError, SpecError, QuantizationError) as exc:
        return None, str(exc)
    return SidecarCapacity(plan, scenarios), ""
