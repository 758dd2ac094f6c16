"""Cheap valid lower bounds on the makespan and energy of any schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass

from energyopt.formulations.taskgraph.model import TaskGraph, objective_value


@dataclass(frozen=True)
class LowerBounds:
    """Bounds that every feasible schedule meets (units in names)."""

    makespan: int  # grid units
    dyn_j: float  # sum over tasks of the least above-idle energy of any option

    def energy_j(self, tg: TaskGraph, makespan: int | None = None) -> float:
        """Least energy of a schedule of makespan >= ``makespan`` (default the bound), J."""
        m = self.makespan if makespan is None else max(makespan, self.makespan)
        return tg.idle_total_w * tg.ms(m) / 1e3 + self.dyn_j

    def objective(self, tg: TaskGraph) -> float:
        """A lower bound on the file's objective (energy and makespan bounds both hold,
        and every objective is nondecreasing in both)."""
        return objective_value(tg.objective, tg.ms(self.makespan), self.energy_j(tg))


def lower_bounds(tg: TaskGraph) -> LowerBounds:
    """Makespan >= the longest chain of fastest durations (no transfers) and >= the
    fastest total work spread over all GPUs; energy >= idle power x that makespan
    plus every task's least above-idle energy (transitions cost >= 0)."""
    fastest = []
    least_dyn = 0.0
    for i in range(tg.n_tasks):
        durs: list[int] = []
        dyns: list[float] = []
        for t in range(len(tg.types)):
            durs.extend(tg.options[t][i].dur)
            dyns.extend(tg.options[t][i].dyn_j)
        fastest.append(min(durs))
        least_dyn += min(dyns)
    finish = [0] * tg.n_tasks
    for i in tg.topo_order:
        finish[i] = fastest[i] + max((finish[p] for p, _ in tg.preds[i]), default=0)
    chain = max(finish)
    work = math.ceil(sum(fastest) / tg.n_gpus)
    return LowerBounds(max(chain, work), least_dyn)
