"""Reading and binding a task-graph file into the model the solvers take.

An ``energy_within`` objective without a stated reference makespan is defined
against HEFT's schedule at every GPU's highest clock (docs/formulations/taskgraph.md),
so binding such a file runs HEFT once; the model module itself runs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from energyopt.catalog.loader import Catalog, bind_catalog
from energyopt.families.taskgraph.formulations.heft import heft_max_clock
from energyopt.families.taskgraph.formulations.model import TaskGraph, bind_taskgraph, with_deadline
from energyopt.families.taskgraph.spec import TaskGraphFile
from energyopt.spec.errors import SpecError
from energyopt.spec.io import parse, read_data


def build_taskgraph(
    spec: TaskGraphFile, source: str = "<taskgraph>", catalog: Catalog | None = None
) -> TaskGraph:
    """Bind a parsed file to the catalog, with its deadline; SpecError lists every
    problem found."""
    tg = bind_taskgraph(spec, source, catalog)
    if spec.objective.kind == "energy_within" and tg.deadline is None:
        return with_deadline(tg, heft_max_clock(tg).makespan(tg))
    return tg


def load_taskgraph(path: str | Path, extra_catalogs: Sequence[str | Path] = ()) -> TaskGraph:
    """Read, validate and bind a task-graph file; SpecError naming file and field."""
    p = Path(path)
    data = read_data(p)
    spec = parse(TaskGraphFile, data, str(p))
    catalog, problems = bind_catalog(extra=extra_catalogs)
    if problems:
        raise SpecError(problems)
    return build_taskgraph(spec, str(p), catalog)
