"""Each plan's predicted power and power limits against the draw the simulator measures.

For each bundled serving instance named (default: the quickstart and fleet-16), one
process solves it with highs-exact, replays Poisson arrivals of mean-sized requests at
the plan's own rates in the simulator (energyopt.sim) and prints, per GPU that is on,
the predicted power (the plan's figure: on-power plus each slice's dynamic power at its
op's design batch, docs/performance-model.md §5), the power limit the plan sets (from
the draw with every slice at its SLO capacity) and the simulated mean draw, with the
ratio of draw to prediction. A limit below the draw would make a real GPU lower its
locked clock. The simulator's passes come from the same pass model as the plan's, so
the gap measured here is the batch accounting alone.

    python benchmarks/power_draw.py                          # quickstart and fleet-16
    python benchmarks/power_draw.py instances/mig-a100.yaml  # any serving instance
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from energyopt.catalog.problem import load_problem
from energyopt.families.serving.solvers.solve import solve
from energyopt.sim.engine import Simulator
from energyopt.sim.synthetic import poisson_arrivals
from energyopt.solvers.presets import load_preset

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = (ROOT / "instances" / "quickstart.yaml", ROOT / "instances" / "fleet-16.yaml")


def report(path: Path, duration_s: float, seed: int) -> None:
    """Print one instance's table."""
    problem = load_problem(path)
    plan = solve(problem, load_preset("highs-exact"), time_limit_s=60).plan
    if plan is None:
        print(f"{path.name}: no plan")
        return
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrivals(
        problem.instance.workloads, lambda t: np.ones_like(t), 1.0, duration_s, 0.0, rng
    )
    res = Simulator(problem, arrivals, window_s=duration_s).run(plan)
    print(f"{path.name}: {len(arrivals):,} requests over {duration_s:g} s at the plan's rates")
    head = ("GPU", "clock", "pred W", "limit W", "drawn W", "x pred")
    print(f"{head[0]:<11} {head[1]:>5} {head[2]:>7} {head[3]:>7} {head[4]:>7} {head[5]:>6}  slices")
    on = [g for g in plan.gpus if g.on]
    over = 0
    for g in on:
        drawn = res.meter.gpus[g.gpu].window_j / duration_s
        limit = g.power_limit_w if g.power_limit_w is not None else float("nan")
        over += int(drawn > limit)
        slices = ", ".join(f"{p.workload} {p.share_pct}% {p.rate_rps:.2f}/s" for p in g.placements)
        print(
            f"{g.gpu:<11} {g.clock_mhz:>5} {g.predicted_power_w:>7.0f} {limit:>7.0f} "
            f"{drawn:>7.0f} {drawn / g.predicted_power_w:>6.2f}  {slices}"
        )
    predicted = sum(g.predicted_power_w for g in on)
    drawn_all = sum(res.meter.gpus[g.gpu].window_j for g in on) / duration_s
    print(
        f"fleet: predicted {predicted:,.0f} W, drawn {drawn_all:,.0f} W "
        f"(x{drawn_all / predicted:.2f}); draw above its limit on {over} of {len(on)} GPUs\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("instances", nargs="*", type=Path, default=list(DEFAULT))
    parser.add_argument("--duration", type=float, default=600.0, help="simulated s")
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    for path in args.instances:
        report(path, args.duration, args.seed)


if __name__ == "__main__":
    main()
