"""Random tiny moe-edge instances and an exhaustive optimiser written apart from the
formulations, for the differential test of every moe-edge solver.

The optimiser reads only the file and the catalog (the GPU roofline and power model
of ``perf`` through ``kernel_costs``, as the verifier does): for every
configuration (dense GPU, one clock per GPU) it lists every placement of every
expert (each GPU, ``fetch``, ``cpu``) and evaluates them all at once with numpy,
from the model's definition in docs/formulations/moe-edge.md: an expert selected
by a share f of tokens is used in a step of b tokens with probability
q = 1 - (1 - f)^b and then serves b f / q tokens; the step's time is the dense
part plus the used experts' times, less a round trip for each co-activated pair
on one remote device; the TBT percentile is bounded by Cantelli (mean + sqrt(p /
(1 - p)) sd). It knows nothing of ``families.moe_edge.formulations`` (no option tables, no
configurations, no programs).

The generator sets the TBT limit (and the TTFT limit and power cap where drawn)
between two neighbouring values that the instance's own plans take, low in their
range, so that the SLO binds, often only a few plans meet it and some instances
have none; a limit never sits within rounding of a plan's value.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from energyopt.catalog.loader import Catalog, builtin_catalog
from energyopt.families.moe_edge.spec import MoeEdgeFile, MoeEdgePlan, memory_limit_gb
from energyopt.perf.kernels import kernel_costs
from energyopt.perf.power import gpu_on_power_w
from energyopt.spec.io import read_data
from energyopt.spec.llm import LlmModel

DATA = Path(__file__).resolve().parent / "data"
TINY_CATALOG = DATA / "moe-edge-tiny-catalog.yaml"
LAUNCH_MS = 0.01
"""Per-expert launch cost at the max clock, ms (docs/formulations/moe-edge.md, §6)."""


def tiny_catalog() -> Catalog:
    """The built-in catalog with the tiny test models of ``TINY_CATALOG``."""
    models = [LlmModel.model_validate(m) for m in read_data(TINY_CATALOG)["models"]]
    return builtin_catalog().merged([], models)


@dataclass(frozen=True)
class Optimum:
    """Exhaustive optimum: objective (J/token or ms/token), or None when no plan exists."""

    value: float | None
    plans: int
    """Plans enumerated (every configuration's)."""
    feasible: int
    """Plans that meet every constraint."""
    plan: MoeEdgePlan | None = None


@dataclass(frozen=True)
class _Table:
    """Every plan of one configuration evaluated: arrays over plans."""

    dense: str
    clocks: dict[str, int]
    combos: NDArray[np.int64]
    mean: NDArray[np.float64]
    tbt: NDArray[np.float64]
    ttft: NDArray[np.float64]
    power: NDArray[np.float64]
    cost: NDArray[np.float64]
    fits: NDArray[np.bool_]


def _tables(spec: MoeEdgeFile, catalog: Catalog) -> list[_Table]:
    model = catalog.model(spec.model)
    server = spec.server
    names = [g.name for g in server.gpus]
    gpus = {g.name: catalog.gpu(g.type) for g in server.gpus}
    places = [*names, "fetch", "cpu"]
    n_l, n_e, k = model.layers, model.experts, model.experts_per_token
    e_params = 3.0 * model.hidden_size * model.intermediate_size
    bpp = model.bytes_per_param
    e_gb = e_params * bpp / 1e9
    dense_params = model.params_total_b * 1e9 - n_l * n_e * e_params
    b, ctx, prompt = spec.batch, spec.context_tokens, spec.slo.prompt_tokens
    kv_gb = b * ctx * model.kv_bytes_per_token / 1e9
    freq = np.array([la.frequencies for la in spec.activations.layers], dtype=np.float64)
    freq = (freq * (k / freq.sum(axis=1, keepdims=True))).ravel()
    n_i = len(freq)
    attn = model.heads * model.head_dim_eff
    cpu = server.cpu

    def kernel(gpu_name: str, clock: int, flops: float, nbytes: float, launch: float) -> tuple:
        gpu = gpus[gpu_name]
        ms, w = kernel_costs(
            gpu,
            np.array([float(clock)]),
            np.array([flops]),
            np.array([nbytes]),
            np.ones(1),
            np.array([launch]),
        )
        return float(ms[0]), max(float(w[0]) - gpu_on_power_w(gpu, clock), 0.0)

    clock_lists = []
    for g in server.gpus:
        gpu = gpus[g.name]
        if g.clocks_mhz:
            clock_lists.append(list(g.clocks_mhz))
        else:
            raise ValueError("the exhaustive optimiser needs clocks_mhz on every GPU")
        assert all(c in gpu.sm_clocks_mhz() for c in clock_lists[-1])
    combos = np.array(list(itertools.product(range(len(places)), repeat=n_i)), dtype=np.int64)
    out = []
    for dense in names:
        for clock_tuple in itertools.product(*clock_lists):
            clocks = dict(zip(names, clock_tuple, strict=True))
            static_w = sum(gpu_on_power_w(gpus[n], clocks[n]) for n in names)
            static_w += cpu.idle_w + server.base_w
            link = next(g for g in server.gpus if g.name == dense).pcie_gbps

            def use(
                where: str,
                tokens: float,
                dense: str = dense,
                clocks: dict[str, int] = clocks,
                link: float = link,
            ) -> tuple[float, float]:
                """(ms, J above static) of one use of an expert at ``where``."""
                if where == "cpu":
                    ms = 1e3 * max(
                        2.0 * e_params * tokens / (cpu.expert_gflops * 1e9),
                        e_params * bpp / (cpu.memory_bandwidth_gbps * 1e9),
                    )
                    return ms + 2 * server.hop_ms, (cpu.active_w - cpu.idle_w) * ms / 1e3
                run_on = dense if where == "fetch" else where
                ms, w = kernel(
                    run_on, clocks[run_on], 2.0 * e_params * tokens, e_params * bpp, LAUNCH_MS
                )
                j = w * ms / 1e3
                if where == "fetch":
                    ms += e_params * bpp / (link * 1e9) * 1e3
                    j += e_params * bpp * 8 * server.pcie_pj_per_bit * 1e-12
                    return ms, j
                return ms + (0.0 if where == dense else 2 * server.hop_ms), j

            m = np.zeros((n_i, len(places)))
            v = np.zeros_like(m)
            dyn = np.zeros_like(m)
            pre = np.zeros_like(m)
            for i, f in enumerate(freq):
                if f <= 0:
                    continue
                q = 1.0 - (1.0 - f) ** b
                qp = 1.0 - (1.0 - f) ** prompt
                for o, where in enumerate(places):
                    ms, j = use(where, b * f / q)
                    m[i, o], v[i, o], dyn[i, o] = q * ms, q * (1 - q) * ms * ms, q * j
                    pre[i, o] = qp * use(where, prompt * f / qp)[0]
            rows = np.arange(n_i)[None, :]
            mean = m[rows, combos].sum(axis=1)
            var = v[rows, combos].sum(axis=1)
            energy = dyn[rows, combos].sum(axis=1)
            ttft = pre[rows, combos].sum(axis=1)
            remote = np.array([p != dense and p != "fetch" for p in places])
            for ca in spec.activations.co_activation:
                a = combos[:, ca.a[0] * n_e + ca.a[1]]
                bb = combos[:, ca.b[0] * n_e + ca.b[1]]
                shared = (a == bb) & remote[a]
                mean = mean - shared * (1.0 - (1.0 - ca.probability) ** b) * 2 * server.hop_ms
            d_ms, d_w = kernel(
                dense,
                clocks[dense],
                2.0 * dense_params * b + 4.0 * n_l * b * ctx * attn,
                dense_params * bpp + b * ctx * model.kv_bytes_per_token,
                gpus[dense].efficiency.step_overhead_ms,
            )
            mean = mean + d_ms
            energy = energy + d_w * d_ms / 1e3 + static_w * mean / 1e3
            p = spec.slo.percentile / 100.0
            tbt = mean + math.sqrt(p / (1 - p)) * np.sqrt(np.maximum(var, 0.0))
            pre_ms, _ = kernel(
                dense,
                clocks[dense],
                2.0 * dense_params * prompt + 2.0 * n_l * prompt**2 * attn,
                dense_params * bpp + prompt * model.kv_bytes_per_token,
                gpus[dense].efficiency.step_overhead_ms,
            )
            ttft = ttft + pre_ms
            fits = np.ones(len(combos), dtype=bool)
            for gi, g in enumerate(server.gpus):
                cap = g.memory_gb if g.memory_gb is not None else gpus[g.name].memory_gb
                used = (combos == gi).sum(axis=1) * e_gb
                if g.name == dense:
                    used = used + dense_params * bpp / 1e9 + kv_gb + spec.reserve_gb
                    used = used + spec.cache_experts * e_gb
                fits &= used <= memory_limit_gb(cap)
            host = (combos >= len(names)).sum(axis=1) * e_gb
            fits &= host <= memory_limit_gb(server.host_memory_gb)
            cost = energy / b if spec.objective.kind == "energy" else mean
            power = energy / (mean / 1e3)
            out.append(_Table(dense, clocks, combos, mean, tbt, ttft, power, cost, fits))
    return out


def _feasible(spec: MoeEdgeFile, t: _Table) -> NDArray[np.bool_]:
    ok = t.fits & (t.tbt <= spec.slo.tbt_ms)
    if spec.slo.ttft_ms is not None:
        ok &= t.ttft <= spec.slo.ttft_ms
    if spec.objective.kind == "latency" and spec.objective.power_cap_w is not None:
        ok &= t.power <= spec.objective.power_cap_w
    return np.asarray(ok, dtype=np.bool_)


def exhaustive_optimum(spec: MoeEdgeFile, catalog: Catalog) -> Optimum:
    """The least cost over every plan of every configuration."""
    model = catalog.model(spec.model)
    places = [*(g.name for g in spec.server.gpus), "fetch", "cpu"]
    best: tuple[float, _Table, int] | None = None
    plans = feasible = 0
    for t in _tables(spec, catalog):
        ok = _feasible(spec, t)
        plans += len(ok)
        feasible += int(ok.sum())
        if ok.any():
            j = int(np.flatnonzero(ok)[np.argmin(t.cost[ok])])
            if best is None or t.cost[j] < best[0]:
                best = (float(t.cost[j]), t, j)
    if best is None:
        return Optimum(None, plans, 0)
    value, t, j = best
    grid = t.combos[j].reshape(model.layers, model.experts)
    plan = MoeEdgePlan(
        dense_gpu=t.dense,
        clocks_mhz=t.clocks,
        placement=tuple(tuple(places[o] for o in row) for row in grid),
    )
    return Optimum(value, plans, feasible, plan)


def _between(values: NDArray[np.float64], rank: float) -> float:
    """A limit between two neighbouring distinct values near quantile ``rank`` (0..1)
    of ``values``, at least 1e-4 relative from each; below the least for rank < 0."""
    u = np.unique(np.round(values[np.isfinite(values)], 12))
    if len(u) < 2:
        return 1.0 if len(u) == 0 else float(u[0] * (1 + 1e-3))
    if rank < 0:
        return float(u[0] * (1 - 1e-3))
    k = min(int(rank * (len(u) - 1)), len(u) - 2)
    while k < len(u) - 2 and u[k + 1] - u[k] < 2e-4 * u[k + 1]:
        k += 1
    return float(0.5 * (u[k] + u[k + 1]))


def _incl(rng: np.random.Generator, n: int, k: int) -> list[float]:
    """Shares of ``n`` experts summing to ``k``, each in (0, 1]."""
    f = rng.dirichlet(np.full(n, 0.7)) * k
    for _ in range(n):
        over = f > 1
        if not over.any():
            break
        f[over] = 1.0
        f[~over] *= (k - over.sum()) / f[~over].sum()
    return [float(x) for x in np.round(np.minimum(f, 1.0), 4)]


def random_doc(seed: int, catalog: Catalog) -> dict[str, Any]:
    """A tiny moe-edge file (Tiny-MoE4: 2 layers x 4 experts, top-2) with one or two
    L4s, tight memory, and limits set from its own plans (see the module text)."""
    rng = np.random.default_rng(seed)
    model = catalog.model("Tiny-MoE4")
    e_params = 3 * model.hidden_size * model.intermediate_size
    e_gb = e_params * model.bytes_per_param / 1e9
    batch = int(rng.choice([1, 2, 4]))
    dense_params = model.params_total_b * 1e9 - model.layers * model.experts * e_params
    dense_gb = (dense_params * model.bytes_per_param + batch * 512 * model.kv_bytes_per_token) / 1e9
    n_gpus = int(rng.choice([1, 1, 2]))
    cache = int(rng.choice([0, 0, 1]))
    gpus: list[dict[str, Any]] = []
    for i in range(n_gpus):
        room = float(rng.uniform(0.5, 4.5)) * e_gb
        gpus.append(
            {
                "name": f"g{i}",
                "type": "L4",
                "memory_gb": round(dense_gb + cache * e_gb + room if i == 0 else room, 6),
                "pcie_gbps": round(float(rng.uniform(1.0, 4.0)), 4),
                "clocks_mhz": [915, 2040] if i == 0 else [int(rng.choice([1200, 2040]))],
            }
        )
    objective = "latency" if rng.random() < 0.25 else "energy"
    doc: dict[str, Any] = {
        "kind": "moe-edge",
        "name": f"tiny-{seed}",
        "model": "Tiny-MoE4",
        "server": {
            "name": "box",
            "gpus": gpus,
            "host_memory_gb": (
                1.0 if rng.random() < 0.8 else round(float(rng.uniform(3, 7)) * e_gb, 6)
            ),
            "cpu": {
                "expert_gflops": round(float(rng.uniform(50, 200)), 2),
                "memory_bandwidth_gbps": round(float(rng.uniform(1.0, 8.0)), 4),
                "idle_w": 30.0,
                "active_w": round(float(rng.uniform(60, 160)), 1),
            },
            "hop_ms": round(float(rng.uniform(0.01, 0.2)), 5),
        },
        "batch": batch,
        "reserve_gb": 0.0,
        "cache_experts": cache,
        "activations": {
            "source": "random test instance",
            "layers": [{"layer": j, "frequencies": _incl(rng, 4, 2)} for j in range(2)],
        },
        "slo": {"tbt_ms": 100.0, "percentile": float(rng.choice([50.0, 80.0, 90.0, 99.0]))},
        "objective": {"kind": objective},
    }
    if objective == "latency":
        doc["objective"]["power_cap_w"] = 1e4  # set from the plans below
    if rng.random() < 0.5:
        a, b = rng.choice(4, 2, replace=False)
        q = round(float(rng.uniform(0.05, 0.5)), 3)
        pair = {"a": [0, int(a)], "b": [0, int(b)], "probability": q}
        doc["activations"]["co_activation"] = [pair]
    spec = MoeEdgeFile.model_validate(doc)
    tables = _tables(spec, catalog)
    fits = np.concatenate([t.fits for t in tables])
    tbt = np.concatenate([t.tbt for t in tables])[fits]
    # among the fastest few tens of plans that fit (where plans cheap in energy are
    # slow, the percentile row decides); 1 in 8 just below every plan
    rank = -1.0 if rng.random() < 0.125 else float(rng.uniform(0.0, 0.001))
    doc["slo"]["tbt_ms"] = round_safe(_between(tbt, rank))
    if rng.random() < 0.3:
        ttft = np.concatenate([t.ttft for t in tables])[fits]
        doc["slo"]["ttft_ms"] = round_safe(_between(ttft, float(rng.uniform(0.5, 0.95))))
        doc["slo"]["prompt_tokens"] = 32
    if objective == "latency":
        power = np.concatenate([t.power for t in tables])[fits]
        doc["objective"]["power_cap_w"] = round_safe(_between(power, float(rng.uniform(0.3, 0.8))))
    return doc


def round_safe(x: float) -> float:
    """``x`` to 9 significant digits (a limit stays well clear of every plan's value)."""
    return float(f"{x:.9g}")


def random_instances(seed: int, count: int) -> list[tuple[dict[str, Any], MoeEdgeFile, Optimum]]:
    """``count`` random tiny instances with their exhaustive optima."""
    catalog = tiny_catalog()
    out = []
    for k in range(count):
        doc = random_doc(seed * 1000 + k, catalog)
        spec = MoeEdgeFile.model_validate(copy.deepcopy(doc))
        out.append((doc, spec, exhaustive_optimum(spec, catalog)))
    return out
