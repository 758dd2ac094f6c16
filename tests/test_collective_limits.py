"""Collective files at the edges of their ranges and solves under limits: a link
too slow for any plan to state is refused naming file and field, the slowest
accepted topology still gives a plan its verifier accepts, and selection and
synthesis keep their time limit on traces too large to search in full."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import highspy
import pytest
import yaml

from energyopt.cli import EXIT_BAD_INPUT, EXIT_OK, main
from energyopt.families import certify, family
from energyopt.families.collective.formulations.costmodel import time_bound_us
from energyopt.families.collective.formulations.model import build_problem, load_collective
from energyopt.families.collective.solvers.select import Evaluator, select_one
from energyopt.families.collective.spec import (
    MAX_BYTES,
    MIN_BANDWIDTH_GBS,
    MIN_HEALTH_FACTOR,
    OPS,
    Collective,
    CollectiveFile,
    CollectivePlan,
    Op,
)
from energyopt.families.collective.tables import (
    FACTORS,
    HealthSummary,
    compile_policy,
    read_policy,
    representative,
)
from energyopt.families.collective.verify import evaluate_collective
from energyopt.progress import quiet
from energyopt.solvers.result import Termination
from energyopt.spec.errors import SpecError

from .cli_helpers import read_exported
from .spec_docs import collective_doc as _spec

FAMILY = family("collective")


def _trace(count: int, n: int) -> list[dict[str, Any]]:
    """``count`` collectives of every op, sizes 1 KiB .. 1 GiB, broadcasts from two roots."""
    return [
        {
            "name": f"c{i}",
            "op": OPS[i % len(OPS)],
            "bytes": 1 << (10 + (7 * i) % 21),
            "count": 1 + i % 5,
            "root": (i // len(OPS)) % 2 * (n - 1),
        }
        for i in range(count)
    ]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            {"network": {"latency_us": 5, "bandwidth_gbs": 1e-300}},
            "topology.network.bandwidth_gbs",
        ),
        ({"nvlink": {"latency_us": 1, "bandwidth_gbs": 1e-9}}, "topology.nvlink.bandwidth_gbs"),
        ({"channel_gbs": 1e-300}, "topology.channel_gbs"),
        ({"reduce_gbs": 1e-300}, "topology.reduce_gbs"),
        ({"health": {"links": [{"gpu": "n0/0", "link": "nic", "factor": 1e-300}]}}, "factor"),
    ],
)
def test_a_vanishing_bandwidth_is_refused_naming_file_and_field(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    """A link at 1e-300 GB/s made solve write a plan of 5e302 us (exit 0) that verify
    refused; such a file is now refused when it is read."""
    data = _spec([2, 2], [{"op": "all_reduce", "bytes": 1 << 20}])
    if "health" in change:
        data.update(change)
        field = "health.links[0].factor"
    else:
        data["topology"].update(change)
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as info:
        load_collective(path)
    assert f"{path}: {field}" in str(info.value)


def test_the_slowest_accepted_topology_solves_to_a_plan_verify_accepts(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Every bandwidth at its least, the link health at its least, a 1000x straggler
    and the largest message: solve writes a plan and verify accepts it."""
    slow = {"latency_us": 10_000, "bandwidth_gbs": MIN_BANDWIDTH_GBS}
    data = _spec(
        [2, 2],
        [{"name": op, "op": op, "bytes": MAX_BYTES, "count": 10_000_000} for op in OPS],
        health={
            "links": [{"gpu": "n0/0", "link": "nic", "factor": MIN_HEALTH_FACTOR}],
            "stragglers": [{"gpu": "n1/1", "slowdown": 1000}],
        },
    )
    data["topology"].update(
        nvlink=slow,
        network=slow,
        channel_gbs=MIN_BANDWIDTH_GBS,
        reduce_gbs=MIN_BANDWIDTH_GBS,
    )
    path = tmp_path / "slowest.yaml"
    path.write_text(yaml.safe_dump(data))
    plan = tmp_path / "plan.json"
    assert main(["solve", str(path), "--solver", "select", "-q", "-o", str(plan)]) == EXIT_OK
    assert main(["verify", str(path), str(plan)]) == EXIT_OK
    capfd.readouterr()


def test_a_bandwidth_below_the_least_is_bad_input_on_the_command_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    data = _spec([2, 2], [{"op": "all_reduce", "bytes": 1 << 20}])
    data["topology"]["network"] = {"latency_us": 5, "bandwidth_gbs": 1e-300}
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(data))
    plan = tmp_path / "plan.json"
    assert main(["solve", str(path), "-q", "-o", str(plan)]) == EXIT_BAD_INPUT
    assert not plan.exists()
    assert f"{path}: topology.network.bandwidth_gbs" in capfd.readouterr().err


@pytest.mark.parametrize("solver", ["select", "auto"])
def test_a_trace_too_large_to_search_keeps_the_time_limit(solver: str) -> None:
    """64 GPUs and 1,000 collectives ran past 60 s under a 10-s limit: selection had
    no limit. With a limit far too short to search, every collective still gets a
    schedule the verifier accepts, the result says the limit stopped it and the log
    names how many collectives were not searched in full."""
    p = build_problem(CollectiveFile.model_validate(_spec([8, 8], _trace(120, 16))))
    r = FAMILY.solve(p, solver, time_limit_s=1e-3, rel_gap=1e-6, progress=quiet)
    certify(FAMILY, p, r, 1e-6, lambda _: None)
    assert r.plan is not None and FAMILY.verify(p, r.plan) == []
    assert len(r.plan.choices) == 120
    assert r.termination == Termination.TIME_LIMIT
    assert r.objective is not None and r.bound is not None and r.bound <= r.objective
    assert any("not searched in full" in line for line in r.log)


def test_synthesis_under_a_short_limit_keeps_selection_for_the_rest() -> None:
    """A small topology with many collectives: each MILP got at least 0.1 s whatever
    the limit (1,000 collectives at 10 s took 100 s). Now collectives whose share is
    too small keep selection's schedule, and the log says how many."""
    p = build_problem(CollectiveFile.model_validate(_spec([2, 2], _trace(60, 4))))
    r = FAMILY.solve(p, "milp", time_limit_s=1e-3, rel_gap=1e-6, progress=quiet)
    certify(FAMILY, p, r, 1e-6, lambda _: None)
    assert r.plan is not None and FAMILY.verify(p, r.plan) == []
    assert r.termination == Termination.TIME_LIMIT
    assert any("got no MILP" in line for line in r.log)


def test_the_batched_policy_compiler_agrees_with_selection_cell_by_cell() -> None:
    """The policy compiler scores all sizes of one op and health state together
    and shares flows across states; every cell is what selection of that one
    collective under the cell's representative state returns."""
    p = build_problem(CollectiveFile.model_validate(_spec([2, 2], _trace(1, 4))))
    ops: tuple[Op, ...] = ("all_reduce", "broadcast")
    pol = compile_policy(p, ops, (12, 26), max_stragglers=0)
    assert pol.unsearched == 0
    evs: dict[int, Evaluator] = {}
    for (op, b, fi, k), cell in pol.cells.items():
        if fi not in evs:
            evs[fi] = Evaluator(p.with_health(representative(p, HealthSummary(FACTORS[fi], k))))
        alone = select_one(evs[fi], Collective(op=op, bytes=1 << b), f"{op}:{1 << b}")
        assert cell == alone.choice, (op, b, fi, k)


def test_the_policy_command_keeps_its_time_limit_and_says_what_it_cut(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The command took 92 CPU-s on tiny-2x2 and ran on for a 64-GPU topology with
    no word. Under a limit too short to search it still writes a full table whose
    every cell is a schedule the verifier accepts, says how many cells the limit
    cut, and reports progress on stderr; with nothing to write it says so."""
    from energyopt.families.collective.tables import main as policy_main

    src = tmp_path / "t.yaml"
    src.write_text(yaml.safe_dump(_spec([2, 2], _trace(1, 4))))
    out = tmp_path / "policy.eot"
    args = [str(src), "--policy", str(out), "--sizes-log2", "10:30:10", "--time-limit", "1e-6"]
    assert policy_main(args) == 0
    std, err = capfd.readouterr()
    assert "cells were not searched in full" in std and "policy:" in err
    pol = read_policy(out)
    assert len(pol.cells) == 4 * 3 * len(FACTORS) * 3
    p = build_problem(CollectiveFile.model_validate(_spec([2, 2], _trace(1, 4))))
    for (op, b, fi, k), cell in pol.cells.items():
        q = p.with_health(representative(p, HealthSummary(FACTORS[fi], k)))
        q = build_problem(
            q.spec.model_copy(
                update={"collectives": (Collective(name="x", op=op, bytes=1 << b),)}
            )
        )
        plan = CollectivePlan(choices=(cell.model_copy(update={"collective": "x"}),))
        assert evaluate_collective(q, plan).violations == [], (op, b, fi, k)
    assert policy_main([str(src)]) == 2
    assert "nothing to write" in capfd.readouterr().err
    assert policy_main([str(src), "--policy", str(out), "--time-limit", "0"]) == 2
    assert "--time-limit" in capfd.readouterr().err


def _two_collectives(tmp_path: Path) -> Path:
    data = _spec(
        [2, 2],
        [
            {"name": "ar", "op": "all_reduce", "bytes": 1 << 20},
            {"name": "ag", "op": "all_gather", "bytes": 1 << 22, "count": 3},
        ],
        health={"links": [{"gpu": "n1/1", "link": "nic", "factor": 0.5}]},
    )
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_per_collective_words_never_claim_more_than_is_proven(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The output said "optimal" per collective (the MILP's optimum of its own
    relaxation) while the trace's gap was 27 %. Now each collective's line gives its
    gap to its own bound, the MILP line says what the MILP proved and over which
    schedules, and "optimal" is only the trace's status when its gap allows it."""
    path = _two_collectives(tmp_path)
    assert main(["solve", str(path), "--solver", "auto", "--time-limit", "600"]) == EXIT_OK
    out = capfd.readouterr().out
    p = load_collective(path)
    trace = next(line for line in out.splitlines() if line.startswith("trace:"))
    status = trace.rsplit("status ", 1)[1]
    gap = float(trace.split("gap ")[1].split("%")[0])
    for line in out.splitlines():
        if "optimal" in line:
            assert line is trace and status == "optimal" and gap <= 1e-4, line
    for i, c in enumerate(p.collectives):
        row = next(line for line in out.splitlines() if line.startswith(p.name_of(i) + " "))
        shown = float(row.split()[-1].rstrip("%"))
        t = float(row.split()[6].replace(",", ""))
        bound = time_bound_us(p, c)
        assert shown == pytest.approx(100 * (t - bound) / t, abs=0.06)
    milp = [line for line in out.splitlines() if ": MILP synthesis" in line]
    assert len(milp) == 2
    for line in milp:
        assert "proven least among copy schedules" in line or "not proven least" in line


def test_the_exported_milp_optimum_is_the_figure_solve_prints(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The exported synthesis MILP's objective matched no figure solve printed (it
    left out launch and latency, and half of an all-reduce). Its optimum is now the
    relaxed time solve reports for the file's first collective."""
    path = _two_collectives(tmp_path)
    assert main(["solve", str(path), "--solver", "milp", "--time-limit", "600"]) == EXIT_OK
    out = capfd.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("ar: MILP synthesis"))
    assert "proven least" in line
    printed = float(line.split("relaxed time ")[1].split(" us")[0].replace(",", ""))
    mps = tmp_path / "ar.mps"
    assert main(["export", str(path), "-o", str(mps)]) == EXIT_OK
    capfd.readouterr()
    h = read_exported(mps)
    h.setOptionValue("mip_rel_gap", 1e-6)
    h.run()
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    assert h.getInfo().objective_function_value == pytest.approx(printed, abs=0.006)
