"""Where a multi-node all-reduce's gap is: the plan's steps or the bound.

For the bundled multi-node topologies without their faults (4 x 8 H100 at 32 MiB,
2 x 8 H100 at 4 and 64 MiB) it prints:

- what NCCL's own tuning model predicts (``nccl._times``) and what the cost model
  gives for NCCL's choice and for the best ring, hierarchical and
  hierarchical_direct candidate (channels 4-32, chunks 1-16, LL128 and Simple),
  beside the one measured multi-node all-reduce of that size in the bundled
  nccl-tests logs (10 nodes x 8 GPUs, 32 MiB);
- the plan of the family default (``auto``) and the bound;
- that plan's program re-timed at 1-8 pipelined chunks, every protocol;
- per global step of that plan (at 1 chunk and at the best count): when its
  flows begin, how long the begin waits on landings (the dataflow barrier of a
  rank's sends), the longest NVLink and NIC occupancy and the reduction part.

All times in us, from the verifier's arithmetic (``verify.py``). Usage:
``nice python benchmarks/collective_steps.py [--time-limit S]`` (about 1 min).
"""

from __future__ import annotations

import argparse
import csv
import os
import time
import types
from pathlib import Path

from energyopt.families import family
from energyopt.families.collective.formulations.calibration import problem_for
from energyopt.families.collective.formulations.costmodel import flows_of, time_bound_us, time_us
from energyopt.families.collective.formulations.model import CollectiveProblem, build_problem
from energyopt.families.collective.formulations.nccl import _times, nccl_choice
from energyopt.families.collective.formulations.schedules import NotApplicable, program_of
from energyopt.families.collective.spec import (
    Choice,
    Collective,
    CollectiveFile,
    CollectivePlan,
)
from energyopt.families.collective.verify import choice_program, run_time_us, step_timeline
from energyopt.progress import quiet

ROOT = Path(__file__).resolve().parents[1]
NCCL_TESTS = ROOT / "data" / "collectives" / "nccl-tests-cluster-h100" / "nccl_tests_parsed.csv"
GPU = "H100-SXM5-80GB"
CASES = ((4, 33554432), (2, 4194304), (2, 67108864))
"""(nodes of 8 GPUs, all-reduce bytes)."""


def healthy(nodes: int, nbytes: int) -> CollectiveProblem:
    """``nodes`` x 8 H100 without faults, one all-reduce of ``nbytes``."""
    spec = CollectiveFile.model_validate(
        {
            "kind": "collective",
            "name": f"healthy-{nodes}x8",
            "topology": {
                "gpu": GPU,
                "nodes": [{"name": f"n{k}", "gpus": 8} for k in range(nodes)],
            },
            "collectives": [{"name": "ar", "op": "all_reduce", "bytes": nbytes}],
        }
    )
    return build_problem(spec, "<healthy>")


def measured(nbytes: int) -> list[str]:
    """The bundled multi-node all-reduce measurements of ``nbytes`` (8 GPUs per node)."""
    with NCCL_TESTS.open() as fh:
        rows = [
            r
            for r in csv.DictReader(fh)
            if r["test"] == "all_reduce_perf"
            and r["mode"] == "multi-node"
            and r["gpus_per_node"] in ("8", "8.0")
            and int(r["size_bytes"]) == nbytes
        ]
    return [
        f"{r['n_nodes']} nodes x 8: out-of-place {float(r['oop_time_us']):.1f} us "
        f"(busbw {float(r['oop_busbw_GBs']):.1f} GB/s), in-place {float(r['ip_time_us']):.1f}"
        for r in rows
    ]


def nccl_side(nodes: int, nbytes: int) -> None:
    """NCCL's model and the cost model's candidates for ``nodes`` x 8 at ``nbytes``."""
    p = problem_for(GPU, nodes, 8)
    c = Collective(op="all_reduce", bytes=nbytes)
    own = _times(p, c)
    ch = nccl_choice(p, c)
    prog = program_of("all_reduce", ch.algorithm, p.n, p.node_of, p.local_of, 0, ch.channels, None)
    model = time_us(p, flows_of(p, prog, ch.chunks), nbytes, ch.protocol, p.gpu.max_sm_clock_mhz)
    print(
        f"  NCCL's model: ring LL128 {own[('Ring', 'LL128')]:.1f}, ring Simple "
        f"{own[('Ring', 'Simple')]:.1f}, tree LL128 {own[('Tree', 'LL128')]:.1f}; it picks "
        f"{ch.algorithm}/{ch.protocol} x{ch.channels}, {ch.chunks} chunks, which the cost "
        f"model times at {model:.1f}"
    )
    for alg in ("ring", "hierarchical", "hierarchical_direct"):
        best: tuple[float, int, int, str] | None = None
        for h in (4, 8, 11, 16, 32):
            try:
                prog = program_of("all_reduce", alg, p.n, p.node_of, p.local_of, 0, h, None)
            except NotApplicable:
                break
            for k in (1,) if alg == "ring" else (1, 2, 4, 8, 16):
                fl = flows_of(p, prog, k)
                for pr in ("ll128", "simple"):
                    t = time_us(p, fl, nbytes, pr, p.gpu.max_sm_clock_mhz)
                    if best is None or t < best[0]:
                        best = (t, h, k, pr)
        if best is not None:
            t, h, k, pr = best
            print(f"  cost model, best {alg}: {t:.1f} ({pr} x{h}, {k} chunks)")
    for nodes_x in (8, 10):
        fake = types.SimpleNamespace(gpu=p.gpu, n=8 * nodes_x, n_nodes=nodes_x, rates=p.rates)
        t = min(_times(fake, c).values())  # type: ignore[arg-type]
        print(f"  NCCL's model on {nodes_x} x 8: {t:.1f}")


def timeline(p: CollectiveProblem, ch: Choice, c: Collective, chunks: int) -> None:
    """Per global step of ``ch``'s program at ``chunks``: begin, the wait on landings,
    the longest NVLink and NIC occupancy (the checker's own timing, ``step_timeline``)."""
    total, steps = step_timeline(p, c, ch, chunks)
    print(f"  timeline at {chunks} chunks ({ch.protocol}, {ch.channels} channels):")
    for g, st in enumerate(steps):
        cross = st.lat_us > p.rates.nvlink_us * 2
        nv, nic = (
            f"{st.busy_us[on].max():.1f} (reduce {st.reduce_us[on].max():.1f})" if on.any() else "-"
            for on in (~cross, cross)
        )
        print(
            f"    step {g}: begins {st.begin_us:7.1f}, waits on landings "
            f"{st.wait_us:5.1f}; longest NVLink flow {nv}, NIC flow {nic}"
        )
    print(f"    time {total:.1f} (launch {p.rates.launch_us})")


def plan_side(nodes: int, nbytes: int, limit: float) -> None:
    """The default's plan for the healthy nodes, its chunk sweep and timelines."""
    fam = family("collective")
    p = healthy(nodes, nbytes)
    c = p.collectives[0]
    t0 = time.perf_counter()
    r = fam.solve(p, "auto", time_limit_s=limit, rel_gap=1e-6, progress=quiet)
    plan = r.plan
    assert isinstance(plan, CollectivePlan)
    ch = plan.choices[0]
    cost = fam.cost(p, plan)
    bound = time_bound_us(p, c)
    print(
        f"  auto ({time.perf_counter() - t0:.1f} s, load {os.getloadavg()[0]:.2f}): "
        f"{cost:.1f} us, {ch.algorithm}/{ch.protocol} x{ch.channels}, {ch.chunks} chunks, "
        f"{ch.pieces} pieces; bound {bound:.2f} ({(cost - bound) / cost:.1%})"
    )
    prog = choice_program(p, c, ch)
    row = []
    best = (float("inf"), 1)
    for k in range(1, 9):
        t, pr = min(
            (
                run_time_us(
                    p, prog, ch.model_copy(update={"chunks": k, "protocol": q}), c, ch.clock_mhz
                )[0],
                q,
            )
            for q in ("ll", "ll128", "simple")
        )
        row.append(f"{k}: {t:.1f} {pr}")
        best = min(best, (t, k))
    print("  the plan's program at 1-8 chunks: " + ", ".join(row))
    timeline(p, ch, c, 1)
    if best[1] != 1:
        timeline(p, ch, c, best[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    args = ap.parse_args()
    print(f"load {os.getloadavg()}")
    for nodes, nbytes in CASES:
        print(f"{nodes} x 8 H100, all-reduce of {nbytes} bytes, no faults")
        if nbytes == 33554432:
            nccl_side(nodes, nbytes)
            for line in measured(nbytes):
                print(f"  measured (nccl-tests, cluster01): {line}")
        plan_side(nodes, nbytes, args.time_limit)
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
