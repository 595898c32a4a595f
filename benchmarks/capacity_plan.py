"""How long the capacity model takes: once per startup (plan + scenarios), once per poll (ceilings, the series'
capacity), and per `kvwatch plan` call (long-context block, inverse planner).

Run: ``.venv/bin/python benchmarks/capacity_plan.py`` (plain timeit, best of 5 repeats; no network).
"""

from __future__ import annotations

import timeit

from kvwatch.capacity import DeploymentSpec, plan_capacity, resolve_model, whatif_ceilings, whatif_scenarios
from kvwatch.capacity.inverse import inverse_plan
from kvwatch.capacity.longcontext import long_context
from kvwatch.capacity.memory import GIB
from kvwatch.capacity.series import resolve
from kvwatch.model import Reading


def main() -> None:
    cases = {
        "Llama-3.1-8B (uniform)": resolve_model("meta-llama/Llama-3.1-8B-Instruct"),
        "gemma-3-27b (7 KV groups)": resolve_model("google/gemma-3-27b-it"),
    }
    for label, arch in cases.items():
        spec = DeploymentSpec(arch=arch, gpu_memory_bytes=79.19 * GIB, gpu_memory_utilization=0.92,
                              max_model_len=32768)
        scenarios = whatif_scenarios(spec)
        plan = plan_capacity(spec)
        reading = Reading(model_name=arch.name, kv_usage_ratio=0.5, kv_capacity_tokens=400_000.0,
                          num_gpu_blocks=25_000.0, block_size=16.0,
                          cache_config={"num_gpu_blocks": "25000", "block_size": "16"})
        for what, fn, number in [
            ("plan_capacity", lambda s=spec: plan_capacity(s), 2000),
            ("whatif_scenarios", lambda s=spec: whatif_scenarios(s), 200),
            ("whatif_ceilings (per poll)", lambda sc=scenarios: whatif_ceilings(sc, 3000.0), 20000),
            ("series capacity (per poll)", lambda r=reading, p=plan: resolve(r, p), 20000),
            ("long_context", lambda p=plan: long_context(p), 500),
            ("inverse_plan (N=64, T=8192)", lambda s=spec: inverse_plan(s, 64, 8192.0), 5),
        ]:
            best = min(timeit.repeat(fn, number=number, repeat=5)) / number
            print(f"{label:<28} {what:<28} {best * 1e6:10.1f} µs")


if __name__ == "__main__":
    main()
