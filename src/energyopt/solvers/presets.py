"""Named solver presets: TOML files in the top-level ``solvers/`` folder."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from energyopt.spec.base import Spec
from energyopt.spec.errors import SpecError
from energyopt.spec.io import read_data, validation_problems

Backend = Literal["highs", "cpsat"]
Formulation = Literal[
    "auto", "pattern", "per_gpu", "plain", "colgen", "shadow_price", "pop", "branch_price", "best"
]
"""``auto``: the configuration formulation where it applies, else per-GPU; ``best``:
the method the instance's shape calls for, each with its own preset's settings
(``families.serving.solvers.solve.auto_choice``)."""


MIP_NODES = 2_000
"""Default node limit of the integer solves of colgen (its master) and shadow-price
(its repair): an effort limit, so a run
gives the same plan on a quiet or a loaded machine while the time limit (then a
safety net) is not reached."""


class SolverPreset(Spec):
    """A solver backend and its options."""

    name: str
    description: str = ""
    backend: Backend = "highs"
    formulation: Formulation = "auto"
    time_limit_s: float = Field(default=60.0, gt=0)
    rel_gap: float = Field(default=1e-4, ge=0, lt=1)
    threads: int | None = Field(
        default=None, gt=0, description="CP-SAT workers; HiGHS sizes its thread pool itself"
    )
    iterations: int = Field(
        default=60, gt=0, description="shadow_price: subgradient iterations at most"
    )
    step: float = Field(
        default=1.0, gt=0, le=2, description="shadow_price: first Polyak step factor theta"
    )
    nodes: int = Field(
        default=2000, gt=0, description="branch_price: branch-and-bound nodes at most"
    )
    mip_nodes: int = Field(
        default=MIP_NODES,
        gt=0,
        description="colgen, shadow-price: branch-and-bound nodes of the integer solve at most",
    )
    exact_nodes: int | None = Field(
        default=None,
        gt=0,
        description="the exact configuration solve (highs-exact's pattern formulation, "
        "branch_price's exact finish): branch-and-bound nodes of each integer solve at most "
        "(an effort limit: where the time limit does not strike first, a run ends the same "
        "on a quiet or a loaded machine); none: each runs until its share of the time limit",
    )
    partitions: int = Field(default=4, ge=1, description="pop: number of sub-problems")
    seed: int = Field(default=0, description="pop: seed of the random split")
    sub_solver: str = Field(default="colgen", description="pop: preset each part is solved with")


def presets_dir() -> Path:
    """Folder of the shipped presets (package data, or ``solvers/`` of a checkout)."""
    packaged = resources.files("energyopt") / "_solvers"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[3] / "solvers"


def available_presets() -> dict[str, Path]:
    """Preset name -> file."""
    return {p.stem: p for p in sorted(presets_dir().glob("*.toml"))}


def load_preset(name_or_path: str) -> SolverPreset:
    """A preset by name (``highs-exact``) or by TOML file path."""
    presets = available_presets()
    path = presets.get(name_or_path)
    if path is None:
        candidate = Path(name_or_path)
        if candidate.suffix == ".toml" and candidate.exists():
            path = candidate
        else:
            raise SpecError(
                [f"--solver: unknown solver {name_or_path!r}; available: {', '.join(presets)}"]
            )
    # the file readers' checks and limits: a FIFO or device, binary bytes, malformed or
    # too deeply nested TOML are refused naming the file
    data = read_data(path, "toml")
    data.setdefault("name", path.stem)
    try:
        return SolverPreset.model_validate(data)
    except ValidationError as exc:
        raise SpecError(validation_problems(exc, str(path), data)) from None
