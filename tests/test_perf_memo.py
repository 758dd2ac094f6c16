"""Remembered SLO capacities and design batches give exactly a fresh run's table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from energyopt.catalog import load_problem
from energyopt.perf import memo
from energyopt.perf.oppoints import OpTable, build_op_table

from .conftest import INSTANCES


def assert_same_table(a: OpTable, b: OpTable) -> None:
    for name, value in a.__dict__.items():
        other = b.__dict__[name]
        if isinstance(value, np.ndarray):
            assert value.dtype == other.dtype and np.array_equal(value, other), name
        else:
            assert value == other, name


def test_a_table_from_remembered_points_equals_a_fresh_one(monkeypatch) -> None:
    problem = load_problem(INSTANCES / "quickstart.yaml")
    memo.forget()
    fresh = build_op_table(problem)
    assert len(memo._memo) > 0
    assert_same_table(build_op_table(problem), fresh)
    # a memo too small for one table keeps only the most recent points
    memo.forget()
    monkeypatch.setattr(memo, "MEMO_POINTS", 5)
    assert_same_table(build_op_table(problem), fresh)
    assert len(memo._memo) == 5
    assert_same_table(build_op_table(problem), fresh)


def test_a_measured_profile_is_never_answered_by_another_ones_points(tmp_path: Path) -> None:
    """Two instances that differ only in their profile's numbers must not share points."""
    data = yaml.safe_load((INSTANCES / "quickstart.yaml").read_text())
    data["profiles"] = [{"gpu": "H100-SXM5-80GB", "model": "Llama-3.1-8B", "file": "prof.csv"}]
    data["workloads"] = data["workloads"][:1]
    data["options"] = {**data.get("options", {}), "clock_count": 2}
    (tmp_path / "inst.yaml").write_text(yaml.safe_dump(data))
    caps = []
    for ms in (20.0, 40.0):
        (tmp_path / "prof.csv").write_text(
            f"phase,tokens,context,tp,latency_ms\ndecode,1,1024,1,{ms}\ndecode,64,1024,1,{ms * 2}\n"
        )
        table = build_op_table(load_problem(tmp_path / "inst.yaml"))
        caps.append(table.capacity_rps[table.tp == 1].max())
    assert caps[1] < caps[0] * 0.9
