"""Can any catalog GPU meet a workload's SLO at all (unloaded, max clock, whole GPUs)?"""

from __future__ import annotations

import numpy as np

from energyopt.catalog.problem import Problem
from energyopt.perf.oppoints import op_spec
from energyopt.perf.params import OpSpec, build_params
from energyopt.perf.queueing import metrics_at

TP_CANDIDATES = (1, 2, 4, 8)


def unreachable_slos(problem: Problem) -> list[str]:
    """'field: message' lines for workloads whose SLO no catalog GPU type can meet.

    One queueing-model run over every workload's candidates (a run costs about the
    same for a few points as for thousands), then a verdict per workload."""
    inst = problem.instance
    per_workload: list[tuple[list[OpSpec], list[str]]] = []
    for wl in inst.workloads:
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
        per_workload.append((specs, labels))
    every = [spec for specs, _ in per_workload for spec in specs]
    if every:
        all_params = build_params(every)
        all_met = metrics_at(all_params, np.full(len(every), 1e-6))
        all_ok = all_met.meets_slo(all_params)
    lines: list[str] = []
    start = 0
    for w, (wl, (specs, labels)) in enumerate(zip(inst.workloads, per_workload, strict=True)):
        if not specs:
            model = problem.model_of(wl)
            lines.append(
                f"workloads[{w}]({wl.name}).model: {wl.model} "
                f"({model.weight_bytes / 1e9:.0f} GB of weights) fits no catalog GPU with up to "
                f"{TP_CANDIDATES[-1]}-way tensor parallelism"
            )
            continue
        rows = slice(start, start + len(specs))
        start += len(specs)
        ok = all_ok[rows]
        ttft, tbt = all_met.ttft_ms[rows], all_met.tbt_ms[rows]
        ttft_slo, tbt_slo = all_params.ttft_slo_ms[rows], all_params.tbt_slo_ms[rows]
        by_gpu: dict[str, bool] = {}
        for label, good in zip(labels, ok, strict=True):
            by_gpu[label] = by_gpu.get(label, True) and bool(good)
        if any(by_gpu.values()):
            continue
        best = int(np.argmin(ttft / ttft_slo + tbt / tbt_slo))
        lines.append(
            f"workloads[{w}]({wl.name}).slo: no catalog GPU meets it even unloaded at its max "
            f"clock; best is {labels[best]} with TTFT {ttft[best]:.0f} ms and TBT "
            f"{tbt[best]:.1f} ms (SLO {wl.slo.ttft_ms:g} / {wl.slo.tbt_ms:g} ms)"
        )
    return lines
