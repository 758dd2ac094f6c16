"""``build_params`` computes the fields shared by specs of one (GPU type, model,
workload, phase, options, profile) once and spreads them: the same arrays, bit for
bit, as a row built per spec (the reference below, as it was written before)."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from energyopt.catalog import load_problem
from energyopt.perf import oppoints
from energyopt.perf.params import PCIE_GBPS, PHASE_CODE, OpParams, OpSpec, _moe_split, build_params

ROOT = Path(__file__).resolve().parents[1]


def rowwise_params(specs: list[OpSpec]) -> OpParams:
    """Stack ``specs`` into arrays."""
    cols: dict[str, list[float]] = {f.name: [] for f in fields(OpParams)}
    for s in specs:
        g, m, w = s.gpu, s.model, s.workload
        shared, expert = _moe_split(m)
        row: dict[str, float] = {
            "peak_flops": g.peak_bf16_tflops * 1e12,
            "peak_bw": g.memory_bandwidth_gbps * 1e9,
            "eff_compute": g.efficiency.compute,
            "eff_memory": g.efficiency.memory,
            "overhead_ms": g.efficiency.step_overhead_ms,
            "clock_ratio": s.clock_mhz / g.max_sm_clock_mhz,
            "sm_fraction": s.sm_fraction,
            "bw_fraction": s.bw_fraction,
            "memory_bytes": s.memory_gb * 1e9,
            "tp": float(s.tp),
            # the fitted link efficiency is an NVLink figure; PCIe is taken at face value
            "link_bw": (g.nvlink_gbps * g.efficiency.link if g.nvlink_gbps else PCIE_GBPS) * 1e9,
            "allreduce_ms": g.efficiency.allreduce_latency_ms,
            "tdp_w": g.tdp_w,
            "idle_w": g.idle_w,
            "sm_power_fraction": g.power.sm_fraction,
            "mem_bound_activity": g.power.memory_bound_sm_activity,
            "voltage_floor": g.power.voltage_floor,
            "knee_fraction": g.power.knee_fraction,
            "locked_clock_w": g.power.locked_clock_w,
            "compute_clock_fixed": g.efficiency.compute_clock_fixed,
            "overhead_clock_fixed": g.efficiency.overhead_clock_fixed,
            "latency_margin": (
                g.efficiency.latency_error
                if s.options.latency_margin == "calibrated"
                else s.options.latency_margin
            ),
            "layers": m.layers,
            "hidden": m.hidden_size,
            "attn_dim": m.heads * m.head_dim_eff,
            "active_params": m.params_active_b * 1e9,
            "weight_bytes": m.weight_bytes,
            "bytes_per_param": m.bytes_per_param,
            "shared_params": shared,
            "expert_params": expert,
            "experts": m.experts,
            "experts_per_token": m.experts_per_token,
            "kv_bytes_per_token": m.kv_bytes_per_token,
            "prompt_tokens": w.prompt_tokens.mean,
            "prompt_cv": w.prompt_tokens.cv,
            "output_tokens": w.output_tokens.mean,
            "chunk_tokens": s.options.chunk_tokens,
            "quantile": w.slo.quantile,
            "ttft_slo_ms": w.slo.ttft_ms,
            "tbt_slo_ms": w.slo.tbt_ms,
            "phase": PHASE_CODE[s.phase],
            "max_batch": s.options.max_batch,
            "profile_clock_ratio": (
                s.profile.clock_mhz / g.max_sm_clock_mhz if s.profile is not None else 1.0
            ),
            "max_clock_mhz": g.max_sm_clock_mhz,
        }
        for key, value in row.items():
            cols[key].append(value)
    arrays: dict[str, NDArray[Any]] = {
        k: np.asarray(v, dtype=np.float64) for k, v in cols.items() if k != "profile"
    }
    arrays["phase"] = np.asarray(cols["phase"], dtype=np.int64)
    profiles = np.empty(len(specs), dtype=object)
    for i, s in enumerate(specs):
        profiles[i] = s.profile
    arrays["profile"] = profiles
    arrays["has_profile"] = np.asarray([s.profile is not None for s in specs], dtype=bool)
    return OpParams(**arrays)


def test_shared_fields_spread_by_index_equal_a_row_per_spec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    specs: list[OpSpec] = []

    def spy(items: list[OpSpec]) -> OpParams:
        specs.extend(items)
        return build_params(items)

    monkeypatch.setattr(oppoints, "build_params", spy)
    for name in ("quickstart", "tensor-parallel", "disaggregated", "fleet-16", "mig-a100"):
        oppoints.build_op_table(load_problem(ROOT / "instances" / f"{name}.yaml"))
    # per-spec fields that differ from every other spec of the same objects
    specs.append(replace(specs[0], clock_mhz=specs[0].clock_mhz / 2, tp=2, memory_gb=1.5))
    got, want = build_params(specs), rowwise_params(specs)
    for f in fields(OpParams):
        a, b = getattr(got, f.name), getattr(want, f.name)
        assert a.dtype == b.dtype, f.name
        if f.name == "profile":
            assert all(x is y for x, y in zip(a, b, strict=True))
        else:
            np.testing.assert_array_equal(a, b, err_msg=f.name)
    empty = build_params([])
    assert len(empty) == 0


def rowwise_distinct(self: OpParams) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``OpParams.distinct`` as it was: np.unique over whole rows, field by field."""
    columns = [
        np.asarray(getattr(self, f.name), dtype=np.float64)
        for f in fields(self)
        if f.name != "profile"
    ]
    ids: dict[int, int] = {}
    for prof in self.profile:
        ids.setdefault(id(prof), len(ids))
    columns.append(np.asarray([ids[id(prof)] for prof in self.profile], dtype=np.float64))
    rows = np.ascontiguousarray(np.stack(columns, axis=1))
    _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    return first.astype(np.int64), inverse.reshape(-1).astype(np.int64)


def test_distinct_rows_by_their_bytes_give_the_table_of_whole_row_comparison(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("fleet-64", "tensor-parallel", "mig-a100"):
        problem = load_problem(ROOT / "instances" / f"{name}.yaml")
        got = oppoints.build_op_table(problem)
        with monkeypatch.context() as m:
            m.setattr(OpParams, "distinct", rowwise_distinct)
            want = oppoints.build_op_table(problem)
        for f in fields(got):
            a, b = getattr(got, f.name), getattr(want, f.name)
            if isinstance(a, np.ndarray):
                np.testing.assert_array_equal(a, b, err_msg=f"{name} {f.name}")
            else:
                assert a == b, (name, f.name)
        params = build_params(
            [
                oppoints.op_spec(
                    problem,
                    w,
                    "both",
                    problem.gpu_type(got.type_names[0]),
                    1000.0,
                    (100, None, 1.0, 1.0, 40.0),
                    1,
                )
                for w in problem.instance.workloads
            ]
        )
        first, inverse = params.distinct()
        old_first, old_inverse = rowwise_distinct(params)
        assert np.array_equal(first[inverse], old_first[old_inverse])
