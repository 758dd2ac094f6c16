"""MIG layouts by placement: the catalog data, the shared rule, the solvers and the verifier."""

from __future__ import annotations

import itertools

import pytest

from energyopt.catalog import builtin_catalog, load_problem, mig
from energyopt.families.serving.solvers.solve import solve
from energyopt.families.serving.verify import verify_plan
from energyopt.perf.oppoints import share_capacity, share_options
from energyopt.solvers.presets import load_preset
from energyopt.spec import GpuType
from energyopt.spec.plan import Placement

from .conftest import INSTANCES

CAT = builtin_catalog()
MIG_TYPES = [g for g in CAT.gpus.values() if g.mig_profiles]


def test_every_mig_gpu_has_placement_data() -> None:
    assert {g.name for g in MIG_TYPES} >= {"A100-SXM4-80GB", "H100-SXM5-80GB", "H200-SXM-141GB"}
    for g in MIG_TYPES:
        assert g.mig_memory_slices == 8 and g.mig_total_slices == 7
        assert sum(p.media_extensions for p in g.mig_profiles) == 1
        for p in g.mig_profiles:
            assert p.memory_slices is not None and p.placements
            assert p.compute_slices <= p.memory_slices  # what the share encoding relies on
            assert len(mig.starts(g, p)) >= p.max_instances or p.media_extensions
            assert all(s + p.memory_slices <= 8 for s in p.placements)


@pytest.mark.parametrize("gpu", MIG_TYPES, ids=lambda g: g.name)
def test_share_knapsack_equals_placement_feasibility(gpu: GpuType) -> None:
    assert mig.aggregate_is_exact(gpu) is None


def _overlap_free(gpu: GpuType, placed: list[tuple[str, int]]) -> bool:
    used: list[int] = []
    for name, start in placed:
        prof = gpu.mig_profile(name)
        assert start in prof.placements
        used.extend(range(start, start + mig.memory_slices(gpu, prof)))
    return len(used) == len(set(used)) and max(used) < gpu.mig_memory_slices


@pytest.mark.parametrize("gpu", MIG_TYPES, ids=lambda g: g.name)
def test_place_finds_a_placement_for_every_feasible_layout(gpu: GpuType) -> None:
    names = [p.name for p in gpu.mig_profiles if not p.media_extensions]
    feasible = 0
    for size in range(1, 5):
        for layout in itertools.combinations_with_replacement(names, size):
            placed = mig.place(gpu, list(layout))
            if mig.layout_problem(gpu, layout) is None:
                feasible += 1
                assert placed is not None and sorted(n for n, _ in placed) == sorted(layout)
                assert _overlap_free(gpu, placed)
            else:
                assert placed is None or any(
                    layout.count(n) > gpu.mig_profile(n).max_instances for n in set(layout)
                )
    assert feasible > 20


def test_known_a100_layouts() -> None:
    a100 = CAT.gpu("A100-SXM4-80GB")
    # NVIDIA MIG User Guide: 3g + 2g + 1g + 1g fits (3g at slice 4), 4g + 2g + 1g + 1g does not
    assert mig.layout_problem(a100, ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]) is None
    # largest first at the lowest start, backtracking when a 1g would need slice 7
    assert mig.place(a100, ["1g.10gb", "3g.40gb", "2g.20gb", "1g.10gb"]) == [
        ("3g.40gb", 4),
        ("2g.20gb", 0),
        ("1g.10gb", 2),
        ("1g.10gb", 3),
    ]
    bad = mig.layout_problem(a100, ["4g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"])
    assert bad is not None and "8 of 7 compute slices" in bad
    old_bundled = mig.layout_problem(a100, ["3g.40gb", "3g.40gb", "1g.20gb"])
    assert old_bundled is not None and "10 of 8 memory slices" in old_bundled
    assert mig.layout_problem(a100, ["1g.10gb+me", "1g.10gb+me"]) is not None
    assert "no MIG profile" in (mig.layout_problem(a100, ["1g.5gb"]) or "")
    # an existing instance pins its slices: 1g at 6 leaves no room for a 3g at 4
    assert mig.place(a100, ["3g.40gb", "3g.40gb"], fixed=[("1g.10gb", 6)]) is None
    assert mig.place(a100, ["3g.40gb"], fixed=[("1g.10gb", 6)]) == [("3g.40gb", 0)]


def test_share_options_use_the_placement_encoding() -> None:
    problem = load_problem(INSTANCES / "mig-a100.yaml")
    a100 = CAT.gpu("A100-SXM4-80GB")
    options = share_options(problem, a100)
    names = [o[1] for o in options]
    assert "1g.10gb+me" not in names and "3g.40gb" in names
    units = {o[1]: o[0] for o in options}
    cap = share_capacity(problem, a100)
    assert units["3g.40gb"] * 2 <= cap < units["3g.40gb"] * 2 + units["1g.20gb"]
    assert units["4g.40gb"] + units["3g.40gb"] <= cap


def test_mig_a100_plan_fits_memory_slices_and_verifier_rejects_the_old_one() -> None:
    problem = load_problem(INSTANCES / "mig-a100.yaml")
    result = solve(problem, load_preset("highs-exact"), time_limit_s=60)
    assert result.plan is not None
    for g in result.plan.gpus:
        names = [p.mig_profile or "" for p in g.placements]
        assert mig.layout_problem(CAT.gpu(g.type), names) is None
    # the layout the issue reported: every workload on one GPU as 3g + 3g + 1g.20gb
    # (one placement of each; the optimum may split a workload over two GPUs)
    one_each: dict[str, Placement] = {}
    for g in result.plan.gpus:
        for p in g.placements:
            one_each.setdefault(p.workload, p)
    placements = list(one_each.values())
    assert len(placements) == 3
    profiles = ["3g.40gb", "3g.40gb", "1g.20gb"]
    crowded = tuple(
        p.model_copy(update={"mig_profile": m}) for p, m in zip(placements, profiles, strict=True)
    )
    first, *rest = result.plan.gpus
    gpus = (
        first.model_copy(update={"on": True, "placements": crowded}),
        *(g.model_copy(update={"on": False, "placements": ()}) for g in rest),
    )
    bad = result.plan.model_copy(update={"gpus": gpus})
    mig_violations = [v for v in verify_plan(problem, bad) if v.kind == "mig"]
    assert [v.where for v in mig_violations] == [first.gpu]
    assert "10 of 8 memory slices" in mig_violations[0].message
