"""The pass model against measured latency, power and sharing, point by point.

Usage: python benchmarks/measured_latency.py [--data DIR]

DIR (default: the checkout's data/, else ../shared/data) holds the public tables:
profiles/splitwise, profiles/vidur, network/vidur; the share-axis section needs
sharing/parvagpu-a100 (ParvaGPU; data/sharing/parvagpu-a100, or ../shared/data).

Sections (docs/performance-model.md, section 10):
1. NCCL all-reduce (Vidur all_reduce.csv, one DGX node) against the model's collective,
   with the shipped constants and with the constants before they were fitted on it.
2. Llama-2-70B prefill on H100 TP 4/8, composed from measurements (Vidur per-layer
   operators x layers + two Vidur all-reduces per layer) against the model's pass.
3. Splitwise Llama-2-70B prompt_time and token_time (batch 1, median of the repeats)
   on H100 and A100 at TP 2/4/8: the planner's pass, the pass through Splitwise's stack
   latency (SPLITWISE_STACK_MS) and the pass with the constants before.
4. P99 TTFT at the max clock, Llama-2-70B on H100 TP 4/8 (1024/128 tokens, 512-token
   chunks), shipped constants against the constants before (no measured values here:
   the vLLM measurement that found the model 2.36x high is not public).
5. Busy power: Splitwise prompt/token power per GPU against the model at the same point.
6. Share axis: ParvaGPU A100 throughput and latency versus MIG size and MPS processes,
   measured scaling over the model's scaling.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from energyopt.catalog import builtin_catalog
from energyopt.perf.calibration import (
    SPLITWISE_STACK_MS,
    mig_fractions,
    params_for,
    phase_power_w,
    predict_allreduce_ms,
    predict_splitwise,
    read_allreduce,
    read_parvagpu,
    read_power_constants,
    read_splitwise,
    read_vidur,
)
from energyopt.perf.energy import steady_power_w
from energyopt.perf.fitting import Tables
from energyopt.perf.forward import prefill_pass
from energyopt.perf.params import OpParams, OpSpec, build_params
from energyopt.perf.power import gpu_on_power_w
from energyopt.perf.queueing import metrics_at
from energyopt.spec.hardware import GpuType
from energyopt.spec.instance import Options
from energyopt.spec.workload import Slo, TokenDist, Workload

ROOT = Path(__file__).resolve().parents[1]
A100 = "A100-SXM4-80GB"
H100 = "H100-SXM5-80GB"
BEFORE = {
    A100: {
        "compute": 0.6806,
        "memory": 0.8355,
        "step_overhead_ms": 2.0379,
        "allreduce_latency_ms": 0.1641,
        "link": 0.1113,
    },
    H100: {
        "compute": 0.5845,
        "memory": 0.8074,
        "step_overhead_ms": 1.9051,
        "allreduce_latency_ms": 0.1166,
        "link": 0.1318,
    },
}
"""The efficiency constants before the collective was fitted on Vidur's NCCL table
(fitted jointly on Splitwise's end-to-end times; commit 265fd28)."""
BEFORE_ACTIVITY = {A100: 0.4706, H100: 0.4238}
"""``memory_bound_sm_activity`` before (commit 265fd28)."""
AR_SIZES = (16384, 131072, 1048576, 8388608, 33554432, 67108864)
"""Message sizes of section 1 (bytes): a decode step's activations at batch 1 (Llama-2-70B,
8192 x 2 bytes) up to a 4096-token prefill chunk (64 MiB)."""


def before(gpu: GpuType) -> GpuType:
    """``gpu`` with the constants it had before (``BEFORE``)."""
    eff = gpu.efficiency.model_copy(update=BEFORE[gpu.name])
    power = gpu.power.model_copy(update={"memory_bound_sm_activity": BEFORE_ACTIVITY[gpu.name]})
    return gpu.model_copy(update={"efficiency": eff, "power": power})


def section_allreduce(tables: Tables, gpus: dict[str, GpuType]) -> None:
    print("== 1. NCCL all-reduce inside one node (Vidur network/vidur/*_dgx/all_reduce.csv)")
    print(f"  {'GPU':<15} {'k':>2} {'bytes':>9} {'measured ms':>11} {'model ms':>9} "
          f"{'ratio':>6} {'before ms':>9} {'ratio':>6}")
    for name, gpu in gpus.items():
        path = tables.allreduce(name)
        if path is None:
            continue
        rows = read_allreduce(path)
        now = predict_allreduce_ms(gpu, rows)
        old = predict_allreduce_ms(before(gpu), rows)
        for k in (2.0, 4.0, 8.0):
            for size in AR_SIZES:
                sel = np.flatnonzero(rows.workers == k)
                i = int(sel[np.argmin(np.abs(rows.size_bytes[sel] - size))])
                m = float(rows.ms[i])
                print(f"  {name:<15} {k:2.0f} {rows.size_bytes[i]:9.0f} {m:11.3f} "
                      f"{now[i]:9.3f} {now[i] / m:6.2f} {old[i]:9.3f} {old[i] / m:6.2f}")
        r_now = now / rows.ms
        r_old = old / rows.ms
        print(f"  {name}: {len(rows.ms)} rows, model/measured median {np.median(r_now):.2f} "
              f"(range {r_now.min():.2f}-{r_now.max():.2f}); before {np.median(r_old):.2f} "
              f"({r_old.min():.2f}-{r_old.max():.2f})")


def vidur_layer_ms(path: Path) -> dict[tuple[int, int], float]:
    """Vidur's per-layer operator time (ms; ``perf.calibration.read_vidur``) by (TP,
    tokens), repeated rows averaged."""
    rows = read_vidur(path)
    acc: dict[tuple[int, int], list[float]] = {}
    for tp, tokens, ms in zip(rows.tp, rows.tokens, rows.layer_ms, strict=True):
        acc.setdefault((tp, int(tokens)), []).append(float(ms))
    return {k: float(np.mean(v)) for k, v in acc.items()}


def section_composed_prefill(tables: Tables, gpus: dict[str, GpuType]) -> None:
    print("== 2. Llama-2-70B prefill on H100, composed from measurements: 80 x (Vidur layer "
          "operators + 2 Vidur all-reduces of tokens x 8192 x 2 bytes); no attention kernel")
    catalog = builtin_catalog()
    model = catalog.model("Llama-2-70B")
    gpu = gpus[H100]
    layers = vidur_layer_ms(tables.root / "profiles" / "vidur" / "h100" / "Llama-2-70b-hf.mlp.csv")
    path = tables.allreduce(H100)
    assert path is not None
    ar = read_allreduce(path)
    print(f"  {'TP':>2} {'tokens':>6} {'composed ms':>11} {'model ms':>9} {'ratio':>6} "
          f"{'before ms':>9} {'ratio':>6}")
    for tp in (4, 8):
        for tokens in (128, 256, 512, 1024, 2048, 4096):
            if (tp, tokens) not in layers:
                continue
            sel = np.flatnonzero(ar.workers == tp)
            size = tokens * model.hidden_size * 2.0
            ar_ms = float(np.interp(size, ar.size_bytes[sel], ar.ms[sel]))
            composed = model.layers * (layers[(tp, tokens)] + 2.0 * ar_ms)
            t = np.asarray([float(tokens)])
            now = float(prefill_pass(params_for(gpu, model, [tp]), t).ms[0])
            old = float(prefill_pass(params_for(before(gpu), model, [tp]), t).ms[0])
            print(f"  {tp:2d} {tokens:6d} {composed:11.1f} {now:9.1f} {now / composed:6.2f} "
                  f"{old:9.1f} {old / composed:6.2f}")


def _median_by_point(
    tp: list[int], prompt: np.ndarray, batch: np.ndarray, values: np.ndarray
) -> dict[tuple[int, int], float]:
    acc: dict[tuple[int, int], list[float]] = {}
    for i, k in enumerate(tp):
        if batch[i] == 1.0:
            acc.setdefault((k, int(prompt[i])), []).append(float(values[i]))
    return {key: float(np.median(v)) for key, v in acc.items()}


def section_splitwise(tables: Tables, gpus: dict[str, GpuType]) -> None:
    print("== 3. Splitwise perf_model.csv, llama2-70b, batch 1 (median of repeats; ms): "
          "planner = the model's pass; stack = through Splitwise's stack latency "
          f"{SPLITWISE_STACK_MS} ms x log2(TP) per all-reduce")
    catalog = builtin_catalog()
    model = catalog.model("Llama-2-70B")
    for hw, name in (("h100-80gb", H100), ("a100-80gb", A100)):
        gpu = gpus[name]
        rows = read_splitwise(tables.splitwise, hw, "llama2-70b")
        plan_pre, plan_dec = predict_splitwise(gpu, model, rows, 0.0)
        st_pre, st_dec = predict_splitwise(gpu, model, rows)
        old_pre, old_dec = predict_splitwise(before(gpu), model, rows, 0.0)
        cols = {
            "meas": (rows.prompt_ms, rows.token_ms),
            "planner": (plan_pre.ms, plan_dec.ms),
            "stack": (st_pre.ms, st_dec.ms),
            "before": (old_pre.ms, old_dec.ms),
        }
        med = {
            (c, j): _median_by_point(rows.tp, rows.prompt, rows.batch, v[j])
            for c, v in cols.items()
            for j in (0, 1)
        }
        print(f"  {hw}: prompt_time | token_time; ratios are model / measured")
        print(f"  {'TP':>2} {'prompt':>6} {'meas':>7} {'planner':>7} {'stack':>6} "
              f"{'before':>6} | {'meas':>5} {'planner':>7} {'stack':>6} {'before':>6}")
        for key in sorted(med[("meas", 0)]):
            mp, mt = med[("meas", 0)][key], med[("meas", 1)][key]
            pr = [med[(c, 0)][key] / mp for c in ("planner", "stack", "before")]
            tr = [med[(c, 1)][key] / mt for c in ("planner", "stack", "before")]
            print(f"  {key[0]:2d} {key[1]:6d} {mp:7.1f} {pr[0]:7.2f} {pr[1]:6.2f} "
                  f"{pr[2]:6.2f} | {mt:5.1f} {tr[0]:7.2f} {tr[1]:6.2f} {tr[2]:6.2f}")


def llama70b_params(gpu: GpuType, tp: int, n: int) -> OpParams:
    """``n`` copies of Llama-2-70B (1024 prompt, 128 output tokens) on whole ``gpu``s at
    TP ``tp``, max clock, 512-token chunks."""
    catalog = builtin_catalog()
    model = catalog.model("Llama-2-70B")
    wl = Workload(
        name="llama70b",
        model=model.name,
        rate_rps=1.0,
        prompt_tokens=TokenDist(mean=1024.0),
        output_tokens=TokenDist(mean=128.0),
        slo=Slo(ttft_ms=1e6, tbt_ms=1e6),
    )
    mem = gpu.memory_gb * (1.0 - Options().memory_reserve_fraction)
    specs = [
        OpSpec(gpu, model, wl, "both", gpu.max_sm_clock_mhz, 1.0, 1.0, mem, tp, Options())
        for _ in range(n)
    ]
    return build_params(specs)


def ttft_p99_ms(gpu: GpuType, tp: int, rates: list[float]) -> np.ndarray:
    """P99 TTFT (ms) of ``llama70b_params`` at each rate (req/s)."""
    p = llama70b_params(gpu, tp, len(rates))
    return np.asarray(metrics_at(p, np.asarray(rates)).ttft_ms)


def busy_power_w(gpu: GpuType, tp: int, rates: list[float]) -> np.ndarray:
    """Board power per GPU (W) of ``llama70b_params`` in steady state at each rate:
    on-power at the max clock plus the steady dynamic power over the group / ``tp``."""
    p = llama70b_params(gpu, tp, len(rates))
    dyn = steady_power_w(p, np.asarray(rates)) / tp
    return np.asarray(gpu_on_power_w(gpu, gpu.max_sm_clock_mhz) + dyn)


def section_ttft(gpus: dict[str, GpuType]) -> None:
    print("== 4. P99 TTFT at 1980 MHz, Llama-2-70B 1024/128 tokens on H100 (ms; before / now)")
    rates = [0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    gpu = gpus[H100]
    print(f"  {'TP':>2} {'req/s':>5} {'before':>8} {'now':>8} {'before/now':>10}")
    for tp in (4, 8):
        old = ttft_p99_ms(before(gpu), tp, rates)
        now = ttft_p99_ms(gpu, tp, rates)
        for r, a, b in zip(rates, old, now, strict=True):
            ratio = f"{a / b:10.2f}" if np.isfinite(a) and np.isfinite(b) else f"{'-':>10}"
            print(f"  {tp:2d} {r:5.1f} {a:8.0f} {b:8.0f} {ratio}")


def section_power(tables: Tables, gpus: dict[str, GpuType]) -> None:
    print("== 5. Busy power per GPU, Llama-2-70B TP 4 (Splitwise power_model_constant.yaml; "
          "model: prefill 4 x 2048 tokens, decode batch 32 at context 1024; W)")
    catalog = builtin_catalog()
    model = catalog.model("Llama-2-70B")
    print(f"  {'GPU':<15} {'phase':<7} {'measured':>8} {'stack':>6} {'planner':>7} "
          f"{'before':>6}")
    for hw, name in (("h100-80gb", H100), ("a100-80gb", A100)):
        gpu = gpus[name]
        const = read_power_constants(tables.power, hw)
        stack = phase_power_w(gpu, model)
        plan = phase_power_w(gpu, model, stack_ms=0.0)
        old = phase_power_w(before(gpu), model, stack_ms=0.0)
        for j, (phase, meas) in enumerate((("prompt", const.prompt_w), ("token", const.token_w))):
            print(f"  {name:<15} {phase:<7} {meas:8.0f} {stack[j]:6.0f} {plan[j]:7.0f} "
                  f"{old[j]:6.0f}")
    rates = [1.0, 3.0, 5.0, 7.0, 9.0]
    print("  steady board power per GPU, Llama-2-70B 1024/128 on H100 at 1980 MHz "
          "(perf.energy.steady_power_w; W, before / now):")
    gpu = gpus[H100]
    for tp in (4, 8):
        old_w = busy_power_w(before(gpu), tp, rates)
        now_w = busy_power_w(gpu, tp, rates)
        print(f"  TP {tp}: " + ", ".join(
            f"{r:.0f} req/s {a:.0f} / {b:.0f}" for r, a, b in zip(rates, old_w, now_w, strict=True)
        ))


def section_sharing(root: Path, gpus: dict[str, GpuType]) -> None:
    folder = root / "sharing" / "parvagpu-a100"
    if not folder.is_dir():
        folder = ROOT.parent / "shared" / "data" / "sharing" / "parvagpu-a100"
    if not folder.is_dir():
        print("== 6. share axis: ParvaGPU data not found (needs data/sharing/"
              "parvagpu-a100); skipped")
        return
    frac = mig_fractions(gpus[A100])
    print("== 6a. MIG size (ParvaGPU A100 80GB, 1 process): measured T(g)/T(7g) over the model's "
          "compute-bound scaling sigma_g/sigma_7 (1.00 = as the model scales)")
    sizes = (1, 2, 3, 4)
    print(f"  {'model':<12} {'batch':>5} " + " ".join(f"{g}g".rjust(6) for g in sizes)
          + "   | memory-bound scaling beta_g/beta_7: "
          + " ".join(f"{frac[g][1] / frac[7][1]:.3f}" for g in sizes))
    ratios: dict[int, list[float]] = {g: [] for g in sizes}
    mps: dict[int, list[tuple[float, float]]] = {2: [], 3: []}
    for path in sorted(folder.glob("*.csv")):
        data = read_parvagpu(path)
        for b in (1, 2, 4, 8, 16, 32, 64, 128):
            if (7, b, 1) not in data:
                continue
            cells = []
            for g in sizes:
                if (g, b, 1) in data:
                    r = (data[(g, b, 1)][0] / data[(7, b, 1)][0]) / (frac[g][0] / frac[7][0])
                    ratios[g].append(r)
                    cells.append(f"{r:6.2f}")
                else:
                    cells.append(f"{'-':>6}")
            print(f"  {path.stem:<12} {b:5d} " + " ".join(cells))
            for w in (2, 3):
                for g in (1, 2, 3, 4, 7):
                    if (g, b, w) in data and (g, b, 1) in data:
                        # the file's Throughput is one process's (batch / Latency)
                        thr = w * data[(g, b, w)][0] / data[(g, b, 1)][0]
                        lat = data[(g, b, w)][1] / data[(g, b, 1)][1]
                        mps[w].append((thr, lat / w))
    print("  median over models and batches: "
          + ", ".join(f"{g}g {np.median(ratios[g]):.2f} (range {min(ratios[g]):.2f}-"
                      f"{max(ratios[g]):.2f})" for g in sizes))
    print("== 6b. MPS processes in one MIG instance: measured / model, where the model gives "
          "each of w processes 1/w of the slice (instance throughput x1, latency per batch xw;\n"
          "  instance throughput = w x the file's Throughput, which is one process's)")
    for w, vals in mps.items():
        thr_all = np.asarray([v[0] for v in vals])
        lat_all = np.asarray([v[1] for v in vals])
        print(f"  w={w}: {len(vals)} points; throughput ratio median {np.median(thr_all):.2f} "
              f"(p10 {np.quantile(thr_all, 0.1):.2f}, p90 {np.quantile(thr_all, 0.9):.2f}); "
              f"latency ratio median {np.median(lat_all):.2f} "
              f"(p10 {np.quantile(lat_all, 0.1):.2f}, p90 {np.quantile(lat_all, 0.9):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    default = ROOT / "data"
    if not (default / "network").is_dir():
        default = ROOT.parent / "shared" / "data"
    parser.add_argument("--data", type=Path, default=default)
    args = parser.parse_args()
    tables = Tables(args.data)
    catalog = builtin_catalog()
    gpus = {name: catalog.gpu(name) for name in (H100, A100)}
    section_allreduce(tables, gpus)
    section_composed_prefill(tables, gpus)
    section_splitwise(tables, gpus)
    section_ttft(gpus)
    section_power(tables, gpus)
    section_sharing(args.data, gpus)


if __name__ == "__main__":
    main()
