"""Write the bundled task-graph instances (instances/taskgraph/*.yaml).

Usage: python benchmarks/make_taskgraphs.py [OUT_DIR]

Larger graphs are not stored: benchmarks/taskgraph.py builds them in memory with
energyopt.families.taskgraph.formulations.generators.
"""

from __future__ import annotations

import sys
from pathlib import Path

from energyopt.families.taskgraph.formulations.generators import (
    cholesky,
    layered,
    lu,
    platform,
    stencil,
)
from energyopt.spec.io import dump


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "cholesky-4x4-l40s.yaml": cholesky(
            4, 4096, platform("L40S", 2), description="tiled Cholesky, FP32 4096 tiles, 2 L40S"
        ),
        "lu-3x3-l4.yaml": lu(
            3, 2048, platform("L4", 2), description="tiled LU, FP32 2048 tiles, 2 L4"
        ),
        "stencil-4x4-l40s.yaml": stencil(
            4,
            4,
            2**26,
            platform("L40S", 4),
            description="7-point stencil, 4 slabs of 2^26 cells, 4 steps, 4 L40S",
        ),
        "layered-3x4-l4-energy.yaml": layered(
            3,
            4,
            platform("L4", 2),
            seed=0,
            objective={"kind": "energy"},
            description="random layered DAG, minimum energy, 2 L4",
        ),
    }
    for name, spec in files.items():
        dump(spec, out / name)
        print(f"wrote {out / name} ({len(spec.tasks)} tasks)")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("instances/taskgraph"))
