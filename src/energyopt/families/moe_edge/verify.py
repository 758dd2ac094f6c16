"""Independent check of a MoE edge plan (``kind: moe-edge``).

From the file and the catalog alone (the GPU roofline and power model of
``perf``, nothing of the solvers' option tables): the plan names every expert of
every layer once, with a known place; its GPUs' clocks are supported; the experts
resident on each GPU (and, on the dense GPU, the dense weights, the KV cache, the
workspace and the fetch cache) fit its memory; host experts fit host memory; the
TBT percentile, bounded by Cantelli's inequality from the step time's mean and
variance, meets the SLO; the mean TTFT meets its limit; under the latency
objective the average power meets the cap. The cost is the plan's energy per token
(J) or expected time per token step (ms).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from energyopt.catalog.loader import Catalog
from energyopt.families.moe_edge.spec import MoeEdgeFile, MoeEdgePlan, memory_limit_gb
from energyopt.perf.kernels import kernel_costs
from energyopt.perf.power import gpu_on_power_w
from energyopt.spec.hardware import GpuType
from energyopt.spec.llm import LlmModel
from energyopt.verify.violation import Violation

REL_TOL = 1e-6
LAUNCH_MS = 0.01
"""Per-expert kernel launch cost at the max clock, ms (the model's stated assumption)."""



def _used(f: float, tokens: int) -> float:
    """Probability that at least one of ``tokens`` tokens, each routed independently,
    picks an expert of frequency ``f``: 1 - (1 - f)^tokens, in a form that keeps its
    precision (and stays above 0) for ``f`` down to the smallest float. A frequency
    scaled to 1 or above (the layer's frequencies are scaled to sum to top-k) keeps
    the plain form."""
    if f >= 1.0:
        return 1.0 - (1.0 - f) ** tokens
    return -math.expm1(tokens * math.log1p(-f))

@dataclass
class MoeEvaluation:
    """What the verifier found; times ms, energies J per step unless named."""

    violations: list[Violation] = field(default_factory=list)
    mean_ms: float = math.nan
    sd_ms: float = math.nan
    tbt_bound_ms: float = math.nan
    ttft_ms: float = math.nan
    step_j: float = math.nan
    energy_per_token_j: float = math.nan
    power_w: float = math.nan
    gpu_used_gb: dict[str, float] = field(default_factory=dict)
    host_used_gb: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    pcie_gb_per_token: float = 0.0
    cost: float = math.nan


def _expert_time(
    gpu: GpuType, clock: int, tokens: float, params: float, bytes_per_param: float
) -> tuple[float, float]:
    """(ms, J above on-power) of one expert on ``gpu`` for ``tokens`` tokens."""
    ms, w = kernel_costs(
        gpu,
        np.array([float(clock)]),
        np.array([2.0 * params * tokens]),
        np.array([params * bytes_per_param]),
        np.ones(1),
        np.array([LAUNCH_MS]),
    )
    extra_w = max(float(w[0]) - gpu_on_power_w(gpu, clock), 0.0)
    return float(ms[0]), extra_w * float(ms[0]) / 1e3


def evaluate_moe_edge(spec: MoeEdgeFile, catalog: Catalog, plan: MoeEdgePlan) -> MoeEvaluation:
    ev = MoeEvaluation()
    bad = ev.violations
    model: LlmModel = catalog.model(spec.model)
    server = spec.server
    names = [g.name for g in server.gpus]
    gpus = {g.name: catalog.gpu(g.type) for g in server.gpus}
    if plan.dense_gpu not in names:
        bad.append(Violation("plan", "dense_gpu", f"{plan.dense_gpu!r} is no GPU of the server"))
        return ev
    for n in names:
        if n not in plan.clocks_mhz:
            bad.append(Violation("plan", f"clocks_mhz.{n}", "no clock given for this GPU"))
        elif plan.clocks_mhz[n] not in gpus[n].sm_clocks_mhz():
            bad.append(
                Violation("clock", n, f"{plan.clocks_mhz[n]} MHz is not a clock of {gpus[n].name}")
            )
    for n in plan.clocks_mhz:
        if n not in names:
            bad.append(Violation("plan", f"clocks_mhz.{n}", "no such GPU"))
    n_l, n_e = model.layers, model.experts
    if len(plan.placement) != n_l or any(len(r) != n_e for r in plan.placement):
        bad.append(Violation("plan", "placement", f"must list {n_l} layers of {n_e} experts each"))
    places = {*names, "fetch", "cpu"}
    for li, row in enumerate(plan.placement):
        for ei, where in enumerate(row):
            if where not in places:
                bad.append(Violation("plan", f"placement[{li}][{ei}]", f"unknown place {where!r}"))
    if bad:
        return ev
    dense = plan.dense_gpu
    h, inter = model.hidden_size, model.intermediate_size
    e_params = 3.0 * h * inter
    bpp = model.bytes_per_param
    e_gb = e_params * bpp / 1e9
    dense_params = model.params_total_b * 1e9 - n_l * n_e * e_params
    b, ctx = spec.batch, spec.context_tokens
    kv_gb = b * ctx * model.kv_bytes_per_token / 1e9
    # memory
    used = {n: 0.0 for n in names}
    used[dense] += dense_params * bpp / 1e9 + kv_gb + spec.reserve_gb + spec.cache_experts * e_gb
    host = 0.0
    counts = {p: 0 for p in places}
    for row in plan.placement:
        for where in row:
            counts[where] += 1
            if where in used:
                used[where] += e_gb
            else:
                host += e_gb
    for g in server.gpus:
        cap = g.memory_gb if g.memory_gb is not None else gpus[g.name].memory_gb
        if used[g.name] > memory_limit_gb(cap):
            bad.append(
                Violation(
                    "memory", g.name, f"needs {used[g.name]:.3f} GB of GPU memory; has {cap:g} GB"
                )
            )
    if host > memory_limit_gb(server.host_memory_gb):
        bad.append(
            Violation("memory", "host", f"needs {host:.3f} GB; has {server.host_memory_gb:g} GB")
        )
    ev.gpu_used_gb, ev.host_used_gb, ev.counts = used, host, counts
    # timing and energy
    clocks = {n: plan.clocks_mhz[n] for n in names}
    static_w = sum(gpu_on_power_w(gpus[n], clocks[n]) for n in names)
    static_w += server.cpu.idle_w + server.base_w
    link = next(g for g in server.gpus if g.name == dense).pcie_gbps
    hop = server.hop_ms
    k = model.experts_per_token
    freq = [np.asarray(la.frequencies, dtype=np.float64) for la in spec.activations.layers]
    freq = [f * (k / f.sum()) for f in freq]
    cpu = server.cpu

    def hit_cost(where: str, tokens: float) -> tuple[float, float, float]:
        """(ms, J above static, bytes over PCIe) of one use of an expert placed at ``where``."""
        if where == "cpu":
            ms = 1e3 * max(
                2.0 * e_params * tokens / (cpu.expert_gflops * 1e9),
                e_params * bpp / (cpu.memory_bandwidth_gbps * 1e9),
            )
            return ms + 2 * hop, (cpu.active_w - cpu.idle_w) * ms / 1e3, 0.0
        run_on = dense if where == "fetch" else where
        ms, j = _expert_time(gpus[run_on], clocks[run_on], tokens, e_params, bpp)
        if where == "fetch":
            nbytes = e_params * bpp
            ms += nbytes / (link * 1e9) * 1e3
            j += nbytes * 8 * server.pcie_pj_per_bit * 1e-12
            return ms, j, nbytes
        return ms + (0.0 if where == dense else 2 * hop), j, 0.0

    memo: dict[tuple[str, float], tuple[float, float, float]] = {}

    def cached(where: str, tokens: float) -> tuple[float, float, float]:
        key = (where, round(tokens, 9))
        if key not in memo:
            memo[key] = hit_cost(where, tokens)
        return memo[key]

    mean = var = dyn = pcie = 0.0
    ttft = 0.0
    prompt = spec.slo.prompt_tokens
    for li, row in enumerate(plan.placement):
        for ei, where in enumerate(row):
            f = float(freq[li][ei])
            if f <= 0:
                continue
            q = _used(f, b)
            ms, j, nbytes = cached(where, b * f / q if q > 0 else 1.0)
            mean += q * ms
            var += q * (1.0 - q) * ms * ms
            dyn += q * j
            pcie += q * nbytes
            if spec.slo.ttft_ms is not None:
                qp = _used(f, prompt)
                ttft += qp * cached(where, prompt * f / qp if qp > 0 else 1.0)[0]
    # co-activated experts of one layer on the same remote device share a round trip
    remote = {n for n in names if n != dense} | {"cpu"}
    saved = 0.0
    for ca in spec.activations.co_activation:
        pa = plan.placement[ca.a[0]][ca.a[1]]
        pb = plan.placement[ca.b[0]][ca.b[1]]
        if pa == pb and pa in remote:
            saved += _used(ca.probability, b) * 2 * hop
    mean -= saved
    attn = model.heads * model.head_dim_eff
    gd = gpus[dense]
    d_ms, d_w = kernel_costs(
        gd,
        np.array([float(clocks[dense])]),
        np.array([2.0 * dense_params * b + 4.0 * n_l * b * ctx * attn]),
        np.array([dense_params * bpp + b * ctx * model.kv_bytes_per_token]),
        np.ones(1),
        np.array([gd.efficiency.step_overhead_ms]),
    )
    dense_ms = float(d_ms[0])
    dyn += max(float(d_w[0]) - gpu_on_power_w(gd, clocks[dense]), 0.0) * dense_ms / 1e3
    mean += dense_ms
    step_j = dyn + static_w * mean / 1e3
    p = spec.slo.percentile / 100.0
    sd = math.sqrt(max(var, 0.0))
    ev.mean_ms, ev.sd_ms = mean, sd
    ev.tbt_bound_ms = mean + math.sqrt(p / (1 - p)) * sd
    ev.step_j = step_j
    ev.energy_per_token_j = step_j / b
    ev.power_w = step_j / (mean / 1e3)
    ev.pcie_gb_per_token = pcie / 1e9 / b
    if ev.tbt_bound_ms > spec.slo.tbt_ms * (1 + REL_TOL):
        bad.append(
            Violation(
                "slo",
                "tbt",
                f"TBT at p{spec.slo.percentile:g} may reach {ev.tbt_bound_ms:.3f} ms "
                f"(mean {mean:.3f} + {math.sqrt(p / (1 - p)):.3g} x sd {sd:.3f}); "
                f"limit {spec.slo.tbt_ms:g} ms",
            )
        )
    if spec.slo.ttft_ms is not None:
        pre_ms, _ = kernel_costs(
            gd,
            np.array([float(clocks[dense])]),
            np.array([2.0 * dense_params * prompt + 2.0 * n_l * prompt**2 * attn]),
            np.array([dense_params * bpp + prompt * model.kv_bytes_per_token]),
            np.ones(1),
            np.array([gd.efficiency.step_overhead_ms]),
        )
        ev.ttft_ms = ttft + float(pre_ms[0])
        if ev.ttft_ms > spec.slo.ttft_ms * (1 + REL_TOL):
            bad.append(
                Violation(
                    "slo", "ttft", f"mean TTFT {ev.ttft_ms:.3f} ms; limit {spec.slo.ttft_ms:g} ms"
                )
            )
    limit_w = spec.objective.power_cap_w
    over = limit_w is not None and ev.power_w > limit_w * (1 + REL_TOL)
    if spec.objective.kind == "latency" and limit_w is not None and over:
        bad.append(Violation("power", "server", f"average {ev.power_w:.2f} W; cap {limit_w:g} W"))
    ev.cost = ev.energy_per_token_j if spec.objective.kind == "energy" else mean
    return ev
