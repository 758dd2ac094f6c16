"""Can any catalog GPU meet a workload's SLO at all (unloaded, max clock, whole GPUs)?"""

from __future__ import annotations

import numpy as np

from energyopt.catalog.problem import Problem
from energyopt.perf.oppoints import op_spec
from energyopt.perf.params import OpSpec, build_params
from energyopt.perf.queueing import metrics_at

TP_CANDIDATES = (1, 2, 4, 8)


def unreachable_slos(problem: Problem) -> list[str]:
    """'field: message' lines for workloads whose SLO no catalog GPU type can meet."""
    inst = problem.instance
    lines: list[str] = []
    for w, wl in enumerate(inst.workloads):
        model = problem.model_of(wl)
        specs: list[OpSpec] = []
        labels: list[str] = []
        for gpu in problem.catalog.gpus.values():
            usable = gpu.memory_gb * (1 - inst.options.memory_reserve_fraction)
            sizes = wl.tensor_parallel or TP_CANDIDATES
            for k in sorted(sizes):
                if model.weight_bytes / 1e9 / k >= usable:
                    continue
                for phase in wl.phases():
                    full = (100, None, 1.0, 1.0, usable)
                    specs.append(op_spec(problem, wl, phase, gpu, gpu.max_sm_clock_mhz, full, k))
                    labels.append(f"{gpu.name} TP{k}" if k > 1 else gpu.name)
        if not specs:
            lines.append(
                f"workloads[{w}]({wl.name}).model: {wl.model} "
                f"({model.weight_bytes / 1e9:.0f} GB of weights) fits no catalog GPU with up to "
                f"{TP_CANDIDATES[-1]}-way tensor parallelism"
            )
            continue
        params = build_params(specs)
        met = metrics_at(params, np.full(len(specs), 1e-6))
        ok = met.meets_slo(params)
        by_gpu: dict[str, bool] = {}
        for label, good in zip(labels, ok, strict=True):
            by_gpu[label] = by_gpu.get(label, True) and bool(good)
        if any(by_gpu.values()):
            continue
        best = int(np.argmin(met.ttft_ms / params.ttft_slo_ms + met.tbt_ms / params.tbt_slo_ms))
        lines.append(
            f"workloads[{w}]({wl.name}).slo: no catalog GPU meets it even unloaded at its max "
            f"clock; best is {labels[best]} with TTFT {met.ttft_ms[best]:.0f} ms and TBT "
            f"{met.tbt_ms[best]:.1f} ms (SLO {wl.slo.ttft_ms:g} / {wl.slo.tbt_ms:g} ms)"
        )
    return lines
