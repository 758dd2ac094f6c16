"""MoE edge serving side by side: LRU offloading, frequency-only placement and
energyopt's joint placement + clocks, replayed token by token.

Instances: instances/moe-edge/ (benchmarks/make_moe_edge.py): Mixtral-8x7B on one L4
and on one L40S with the Fiddler MMLU routing of two subjects (international law,
college computer science), and OLMoE-1B-7B on an L4 with 6 GB left to it with the
AllenAI routing of two text domains (GitHub, C4).

Contenders, all replayed on the same sampled routing (families/moe_edge/sim.py; tokens and
layers independent, from the measured per-layer shares: no public per-token
traces exist):

- ``offload-lru``: every expert in host memory, fetched on use into an LRU cache
  that takes all GPU memory left after the dense part (the common baseline,
  e.g. Mixtral offloading); max clock;
- ``freq-lru``: the most-selected experts resident up to GPU memory (less the
  file's cache), the rest fetched through an LRU cache; max clock;
- ``energyopt``: the ``lagrangian`` solver's plan (placement over GPU, fetch and
  CPU, dense GPU, clocks) with the sparsity-aware cache; also with LRU and LFU
  caches (the online comparison);
- the ``milp`` optimum, for the heuristic's gap;
- baselines that can hold the SLO, each tuned to it (the least-energy clock whose
  replay keeps the SLO's percentile of steps within the limit): Fiddler's policy
  (most-selected experts resident, the others on the CPU below 10 tokens per step,
  else fetched), at the max clock and with the clock tuned; a popularity-pinned
  cache (most-selected resident, the rest fetched through the file's LRU slots);
  LRU offloading. Energy per token at equal attainment against each.

Targets: energy per token at least 30 % below ``offload-lru`` at equal or better
TBT attainment (share of steps within the file's TBT limit), and the heuristic
within 2 % of the MILP optimum. A calibration block compares the offload model
with the measured offloading baselines (Fiddler's DeepSpeed-MII on L4 and Mixtral
offloading on an RTX 6000 Ada) and the specMoE copy times. A last block compiles
the activation-mix lookup table (families/moe_edge/tables.py) for OLMoE between GitHub and
C4 routing and replays its plan for the mix estimated from a window of tokens
against the fixed GitHub plan.

Run: python benchmarks/moe_edge.py [--tokens N] [--data DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from energyopt.catalog.loader import builtin_catalog
from energyopt.families.moe_edge.formulations.model import Config, MoeEdgeProblem, load_moe_edge
from energyopt.families.moe_edge.sim import POLICIES, CachePolicy, MoeSim, sample_routing, simulate
from energyopt.families.moe_edge.solvers.lagrangian import solve_lagrangian
from energyopt.families.moe_edge.solvers.milp import solve_milp
from energyopt.families.moe_edge.spec import MoeEdgePlan
from energyopt.families.moe_edge.verify import evaluate_moe_edge
from make_moe_edge import DATA, MIXTRAL_BYTES, fiddler_layers, fitted_pcie_gbps

ROOT = Path(__file__).resolve().parent.parent
INSTANCES = [
    "mixtral-l4-law",
    "mixtral-l4-cs",
    "mixtral-l40s-law",
    "mixtral-l40s-cs",
    "olmoe-l4-github",
    "olmoe-l4-c4",
    "mixtral-2xl4-law",
    "olmoe-l4-github-capped",
]
ENERGY_ROWS = INSTANCES[:6]
"""Instances the energy target is judged on: one GPU (the simulator's one cache sits on
the dense GPU, so an offloading baseline on two GPUs would leave one idle) and the
energy objective."""
ENERGY_TARGET = 0.30
GAP_TARGET = 0.02


def free_slots(p: MoeEdgeProblem) -> int:
    """Experts that fit the dense GPU beside the dense part at max clock (the file's
    cache slots included)."""
    c = p.costs(p.max_clock_config())
    return int(np.floor(c.gpu_free_gb[0] / p.expert_gb + 1e-9)) + p.spec.cache_experts


def offload_plan(p: MoeEdgeProblem) -> MoeEdgePlan:
    return p.plan_of(p.max_clock_config(), np.full(p.n_items, p.fetch))


def frequency_plan(p: MoeEdgeProblem, rest: int) -> MoeEdgePlan:
    """The most-selected experts resident (GPU by GPU, the dense GPU keeping the file's
    cache), the rest at option ``rest`` (fetch or cpu); max clocks."""
    c = p.costs(p.max_clock_config())
    choice = np.full(p.n_items, rest)
    order = iter(np.argsort(-p.freq.ravel(), kind="stable").tolist())
    for g in range(p.n_gpus):
        for _ in range(max(int(np.floor(c.gpu_free_gb[g] / p.expert_gb + 1e-9)), 0)):
            item = next(order, None)
            if item is not None:
                choice[item] = g
    return p.plan_of(p.max_clock_config(), choice)


FIDDLER_FETCH_FROM_TOKENS = 10
"""Fiddler's rule: a host expert runs on the CPU below this many tokens per step (its
costs 7 per CPU token vs 70 per fetch, src/fiddler/mixtral.py)."""


def popular_plan(p: MoeEdgeProblem, config: Config, rest: int) -> MoeEdgePlan:
    """The most-selected experts pinned on the GPUs up to the memory energyopt's plans
    may use (the file's cache slots stay a cache, used or not, as in energyopt's
    plans), the rest at option ``rest``; clocks and dense GPU of ``config``."""
    c = p.costs(config)
    choice = np.full(p.n_items, rest)
    order = iter(np.argsort(-p.freq.ravel(), kind="stable").tolist())
    for g in [config.dense, *(g for g in range(p.n_gpus) if g != config.dense)]:
        slots = max(int(np.floor(c.gpu_free_gb[g] / p.expert_gb + 1e-9)), 0)
        for _ in range(slots):
            item = next(order, None)
            if item is not None:
                choice[item] = g
    return p.plan_of(config, choice)


@dataclass
class Tuned:
    """A baseline at the least-energy setting whose replay meets the SLO (or, when none
    does, at the setting with the best attainment)."""

    sim: MoeSim
    config: Config
    meets: bool


def tuned(
    p: MoeEdgeProblem,
    routing: np.ndarray,
    plan_of: Callable[[Config], MoeEdgePlan],
    policy: CachePolicy,
    *,
    cache_slots: int | None = None,
    fetch_from_tokens: int | None = None,
    configs: list[Config] | None = None,
) -> Tuned:
    """Replay the baseline at every configuration (dense GPU, clocks) and keep the one
    with the least energy per token among those whose TBT attainment (share of steps
    within the file's limit) is at least the SLO's percentile."""
    need = p.spec.slo.percentile / 100.0
    tbt = p.spec.slo.tbt_ms
    found: Tuned | None = None
    fallback: Tuned | None = None
    for config in configs if configs is not None else p.configs():
        if p.costs(config).gpu_free_gb[config.dense] < 0:
            continue
        sim = simulate(
            p,
            plan_of(config),
            routing,
            policy,
            cache_slots=cache_slots,
            fetch_from_tokens=fetch_from_tokens,
        )
        if sim.attainment(tbt) >= need:
            if found is None or sim.energy_per_token_j < found.sim.energy_per_token_j:
                found = Tuned(sim, config, True)
        elif fallback is None or sim.attainment(tbt) > fallback.sim.attainment(tbt):
            fallback = Tuned(sim, config, False)
    best = found or fallback
    assert best is not None
    return best


def slo_block(
    p: MoeEdgeProblem, routing: np.ndarray, mine: MoeSim
) -> tuple[list[str], dict[str, Tuned]]:
    """The baselines that can hold the SLO, each tuned over the clocks (and the dense
    GPU), against energyopt's plan at equal attainment."""
    tbt = p.spec.slo.tbt_ms
    need = p.spec.slo.percentile
    max_clock = [p.max_clock_config(d) for d in range(p.n_gpus)]
    contenders = {
        "fiddler (max clock)": tuned(
            p,
            routing,
            lambda k: popular_plan(p, k, p.cpu),
            "lru",
            cache_slots=0,
            fetch_from_tokens=FIDDLER_FETCH_FROM_TOKENS,
            configs=max_clock,
        ),
        "fiddler (tuned clock)": tuned(
            p,
            routing,
            lambda k: popular_plan(p, k, p.cpu),
            "lru",
            cache_slots=0,
            fetch_from_tokens=FIDDLER_FETCH_FROM_TOKENS,
        ),
        "pinned cache (tuned)": tuned(p, routing, lambda k: popular_plan(p, k, p.fetch), "lru"),
        "offload-lru (tuned)": tuned(
            p,
            routing,
            lambda k: p.plan_of(k, np.full(p.n_items, p.fetch)),
            "lru",
            cache_slots=free_slots(p),
        ),
    }
    out = [
        f"  SLO-holding baselines (least J/token over the clocks with >= {need:g} % of steps "
        f"within {tbt:g} ms on this replay; energyopt {mine.energy_per_token_j:.3f} J/token "
        f"at {100 * mine.attainment(tbt):.1f} %):"
    ]
    for label, t in contenders.items():
        e = t.sim.energy_per_token_j
        verdict = (
            f"energyopt {100 * (mine.energy_per_token_j / e - 1):+.1f} % at equal attainment"
            if t.meets
            else f"misses the SLO at every setting (best {100 * t.sim.attainment(tbt):.1f} %)"
        )
        out.append(
            f"    {label:<22} clocks {list(t.config.clocks)} MHz: {e:8.3f} J/token, "
            f"{100 * t.sim.attainment(tbt):5.1f} % attainment, {t.sim.tokens_per_s:.3f} tok/s"
            f" -> {verdict}"
        )
    return out, contenders


def row(name: str, sim: MoeSim, tbt_ms: float, base: MoeSim | None) -> str:
    e = sim.energy_per_token_j
    ratio = "" if base is None else f"{e / base.energy_per_token_j:6.3f}"
    return (
        f"  {name:<22} {sim.tokens_per_s:8.3f} {sim.tbt_percentile_ms(90):9.1f} "
        f"{100 * sim.attainment(tbt_ms):7.1f} {e:9.3f} {ratio:>6} "
        f"{sim.pcie_bytes / 1e9 / max(sim.tokens, 1):8.3f}"
    )


def calibration(data: Path, tokens: int) -> list[str]:
    """The offload side against the measured baselines."""
    out = ["calibration of the offload side:"]
    rate = fitted_pcie_gbps(data)
    mii = data / "moe/fiddler-mixtral/offload_baselines/L4"
    with next(mii.glob("*-MII.csv")).open() as fh:
        rows = [{k.strip(): v.strip() for k, v in r.items()} for r in csv.DictReader(fh)]
    b1 = [r for r in rows if r["batch_size"] == "1"]
    per_tok = np.mean([float(r["time"]) / float(r["output_token"]) for r in b1])
    out.append(
        f"  host-to-GPU rate fitted on DeepSpeed-MII/L4 one-token runs: {rate:.2f} GB/s; "
        f"MII/L4 batch-1 decode measured {per_tok:.2f} s/token, model "
        f"(all {MIXTRAL_BYTES / 1e9:.1f} GB streamed per token) {MIXTRAL_BYTES / 1e9 / rate:.2f} s "
        f"({100 * (MIXTRAL_BYTES / 1e9 / rate / per_tok - 1):+.1f} %)"
    )
    spec_moe = json.loads((data / "moe/specmoe-rtx3090/memory_benchmark_results.json").read_text())
    one = spec_moe["cpu_to_gpu"]["batch_1"]
    ten = spec_moe["cpu_to_gpu"]["batch_10"]
    out.append(
        f"  specMoE RTX 3090 pageable copies: {one['throughput_mb_s'] / 1e3:.2f} GB/s (1 expert), "
        f"{ten['throughput_mb_s'] / 1e3:.2f} GB/s (10 experts): the fitted L4 rate is "
        f"{rate / (ten['throughput_mb_s'] / 1e3):.2f}x the sustained pageable rate"
    )
    merge = data / "moe/fiddler-mixtral/offload_baselines/Ada6000/Mixtral-Offload-merge.csv"
    with merge.open() as fh:
        rows = [{k.strip(): v.strip() for k, v in r.items()} for r in csv.DictReader(fh)]
    measured = np.mean([float(r["decode_time"]) / float(r["output_token"]) for r in rows])
    p = load_moe_edge(ROOT / "instances/moe-edge/mixtral-l40s-cs.yaml")
    sims = []
    for subject in ("college_computer_science", "international_law"):
        layers = fiddler_layers(data, subject)
        freq = np.asarray(layers) * (2.0 / np.asarray(layers).sum(axis=1, keepdims=True))
        routing = sample_routing(freq, 2, tokens, seed=7)
        sims.append(simulate(p, offload_plan(p), routing, "lru", cache_slots=96))
    predicted = np.mean([1e-3 * np.mean(s.step_ms) for s in sims])
    fetch_s = np.mean([s.fetched / s.tokens * p.expert_gb / rate for s in sims])
    implied = fetch_s * rate / max(measured - (predicted - fetch_s), 1e-9)
    out.append(
        f"  Mixtral offloading (bf16, 3 of 8 experts per layer cached on GPU) on RTX 6000 Ada: "
        f"measured decode {measured:.3f} s/token; model (L40S, same AD102 die, 96-expert LRU "
        f"cache, fitted L4 link rate, MMLU routing) {predicted:.3f} s/token "
        f"({100 * (predicted / measured - 1):+.1f} %); the measured time implies a host link of "
        f"{implied:.1f} GB/s on that box (the model's other terms kept)"
    )
    return out


def mix_table_block(tokens: int) -> list[str]:
    """The activation-mix lookup table on OLMoE / L4: GitHub (mix 1) to C4 (mix 0)."""
    import tempfile

    from energyopt.families.moe_edge.tables import MixTable, compile_mix_table, mixed_problem

    a_p = load_moe_edge(ROOT / "instances/moe-edge/olmoe-l4-github.yaml")
    b_p = load_moe_edge(ROOT / "instances/moe-edge/olmoe-l4-c4.yaml")
    out = ["activation-mix lookup table (OLMoE-1B-7B on L4, GitHub = mix 1 .. C4 = mix 0):"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "olmoe-mix.eot"
        t0 = time.perf_counter()
        objs = compile_mix_table(a_p, a_p.freq, b_p.freq, path, cells=11)
        compile_s = time.perf_counter() - t0
        table = MixTable.open(path)
        static = solve_lagrangian(a_p).plan
        assert static is not None
        cells = ", ".join(f"{o:.3f}" if o is not None else "-" for o in objs)
        out.append(
            f"  compiled 11 cells in {compile_s:.1f} s; J/token per cell (mix 0..1): {cells}"
        )
        k = a_p.model.experts_per_token
        for true_mix in (0.0, 0.5):
            p = mixed_problem(a_p, a_p.freq, b_p.freq, true_mix)
            routing = sample_routing(p.freq, k, tokens, seed=11)
            window = routing[: tokens // 3]
            counts = np.zeros_like(p.freq)
            for layer in range(p.n_layers):
                np.add.at(counts[layer], window[:, layer, :].ravel(), 1.0)
            reps = 200
            t1 = time.perf_counter()
            for _ in range(reps):
                est = table.estimate(counts)
                cell = table.cell(est)
                _ = table.table.array("place")[cell]
            decide_us = (time.perf_counter() - t1) / reps * 1e6
            plan = table.plan_at(cell)
            assert plan is not None
            replay = routing[tokens // 3 :]
            fixed = simulate(p, static, replay, "sparsity")
            adapted = simulate(p, plan, replay, "sparsity")
            tbt = p.spec.slo.tbt_ms
            change = adapted.energy_per_token_j / fixed.energy_per_token_j - 1
            out.append(
                f"  true mix {true_mix:.1f}: estimated {est:.3f} from {len(window)} tokens "
                f"(cell {table.mixes[cell]:.1f}, {decide_us:.0f} us per decision); GitHub plan "
                f"{fixed.energy_per_token_j:.3f} J/token ({100 * fixed.attainment(tbt):.1f} % "
                f"attainment) -> table plan {adapted.energy_per_token_j:.3f} J/token "
                f"({100 * adapted.attainment(tbt):.1f} %), {100 * change:+.1f} %"
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=600, help="decode steps replayed per contender")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument(
        "--instances", nargs="+", default=INSTANCES, choices=INSTANCES, help="a subset to run"
    )
    ap.add_argument(
        "--skip-extras", action="store_true", help="leave out the mix table and calibration blocks"
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    catalog = builtin_catalog()
    summary: list[str] = []
    header = (
        f"  {'contender':<22} {'tok/s':>8} {'TBT p90':>9} {'attain%':>7} {'J/token':>9} "
        f"{'ratio':>6} {'PCIe GB/t':>8}"
    )
    slo_summary: list[str] = []
    for name in args.instances:
        p = load_moe_edge(ROOT / "instances" / "moe-edge" / f"{name}.yaml")
        tbt = p.spec.slo.tbt_ms
        unit = "J/token" if p.spec.objective.kind == "energy" else "ms/token"
        milp = solve_milp(p, time_limit_s=120)
        lag = solve_lagrangian(p, time_limit_s=120)
        assert lag.plan is not None and milp.plan is not None
        for res in (milp, lag):
            assert res.plan is not None
            assert evaluate_moe_edge(p.spec, catalog, res.plan).violations == []
        routing = sample_routing(p.freq, p.model.experts_per_token, args.tokens, seed=1)
        slots = free_slots(p)
        base = simulate(p, offload_plan(p), routing, "lru", cache_slots=slots)
        others = {
            "freq-lru": simulate(p, frequency_plan(p, p.fetch), routing, "lru"),
            "freq-cpu": simulate(p, frequency_plan(p, p.cpu), routing, "lru"),
            "energyopt": simulate(p, lag.plan, routing, "sparsity"),
        }
        ev = evaluate_moe_edge(p.spec, catalog, lag.plan)
        counts = ", ".join(f"{k} {v}" for k, v in ev.counts.items())
        gpus = " + ".join(g.type for g in p.spec.server.gpus)
        print(
            f"{name}: {p.model.name} on {gpus}, TBT limit {tbt:g} ms (p{p.spec.slo.percentile:g}), "
            f"objective {unit}; energyopt plan: {counts}; dense on {lag.plan.dense_gpu}, clocks "
            f"{lag.plan.clocks_mhz}"
        )
        print(header)
        print(row("offload-lru", base, tbt, None))
        for label, sim in others.items():
            print(row(label, sim, tbt, base))
        block, held = slo_block(p, routing, others["energyopt"])
        print("\n".join(block))
        if name in ENERGY_ROWS:
            mine = others["energyopt"]
            meeting = {k: t for k, t in held.items() if t.meets}
            if meeting:
                label, t = min(meeting.items(), key=lambda kv: kv[1].sim.energy_per_token_j)
                slo_summary.append(
                    f"  {name:<22} energyopt {mine.energy_per_token_j:8.3f} J/token "
                    f"({100 * mine.attainment(tbt):5.1f} %) vs best SLO-holding baseline "
                    f"{label} {t.sim.energy_per_token_j:8.3f} "
                    f"({100 * t.sim.attainment(tbt):5.1f} %): "
                    f"{100 * (mine.energy_per_token_j / t.sim.energy_per_token_j - 1):+.1f} %"
                )
            else:
                slo_summary.append(f"  {name:<22} no baseline holds the SLO at any clock")
        caches = {
            pol: simulate(p, offload_plan(p), routing, pol, cache_slots=slots) for pol in POLICIES
        }
        hits = ", ".join(
            f"{pol} {100 * s.cached / max(s.cached + s.fetched, 1):.1f} % hits / "
            f"{s.energy_per_token_j:.2f} J/t"
            for pol, s in caches.items()
        )
        print(f"  caches on the offload placement ({slots} slots): {hits}")
        if ev.counts.get("fetch", 0):
            mine = {pol: simulate(p, lag.plan, routing, pol) for pol in POLICIES}
            hits = ", ".join(
                f"{pol} {100 * s.cached / max(s.cached + s.fetched, 1):.1f} % hits / "
                f"{s.energy_per_token_j:.3f} J/t"
                for pol, s in mine.items()
            )
            print(f"  caches on the energyopt plan ({p.spec.cache_experts} slots): {hits}")
        assert milp.objective is not None and lag.objective is not None
        gap = lag.objective / milp.objective - 1.0
        print(
            f"  solvers: milp {milp.objective:.5g} {unit} ({milp.status}, bound {milp.bound:.5g}, "
            f"{milp.wall_s:.2f} s), lagrangian {lag.objective:.5g} (bound {lag.bound:.5g}, "
            f"{lag.wall_s:.2f} s): heuristic - optimum {100 * gap:+.3f} %"
        )
        best = others["energyopt"]
        gap_text = (
            f"heuristic gap {100 * gap:+.3f} % -> {'met' if gap <= GAP_TARGET else 'not met'}"
        )
        if name in ENERGY_ROWS:
            saving = 1.0 - best.energy_per_token_j / base.energy_per_token_j
            attain_ok = best.attainment(tbt) >= base.attainment(tbt)
            met_e = saving >= ENERGY_TARGET and attain_ok
            vs_cpu = 1.0 - best.energy_per_token_j / others["freq-cpu"].energy_per_token_j
            need = p.spec.slo.percentile
            if 100 * base.attainment(tbt) < need:
                # a saving against a plan that breaks the SLO is no met target: the
                # like-for-like figure is the equal-attainment block below
                verdict = (
                    f"not judged: offload-lru misses the SLO (p{need:g} needed), "
                    "see the equal-attainment block"
                )
            else:
                verdict = "met" if met_e else "not met"
            summary.append(
                f"  {name:<22} energy -{100 * saving:5.1f} % vs offload-lru "
                f"(-{100 * vs_cpu:4.1f} % vs freq-cpu), attainment "
                f"{100 * best.attainment(tbt):5.1f} vs {100 * base.attainment(tbt):5.1f} % "
                f"-> {verdict}; {gap_text}"
            )
        else:
            summary.append(f"  {name:<22} (energy target not judged here); {gap_text}")
    if not args.skip_extras:
        print("\n".join(mix_table_block(args.tokens)))
    print(
        "targets (>= 30 % less energy per token than offload-lru at equal or better TBT "
        "attainment, judged only where offload-lru holds the SLO; heuristic within 2 % of "
        "the MILP optimum):"
    )
    print("\n".join(summary))
    print(
        "energy per token at equal attainment (each baseline at its least-energy clock that "
        "holds the SLO on the replay; energyopt's plan as solved):"
    )
    print("\n".join(slo_summary))
    if not args.skip_extras:
        print("\n".join(calibration(args.data, args.tokens)))
    print(f"wall {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
