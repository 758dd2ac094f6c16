"""Checkpoints: chaining across re-applies, and restore against malformed files."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from energyopt.catalog import builtin_catalog
from energyopt.cli import main
from energyopt.nvml.actions import Ctx
from energyopt.nvml.planner import plan_actions
from energyopt.nvml.sim import SimMps, SimulatedNvml
from energyopt.nvml.transaction import Transaction, read_checkpoint, restore
from energyopt.spec import GpuPlan, Placement, Plan

CAT = builtin_catalog()
H100 = "H100-SXM5-80GB"


def host(n: int = 2) -> tuple[SimulatedNvml, Ctx]:
    sim = SimulatedNvml([CAT.gpu(H100)] * n)
    return sim, Ctx(sim, SimMps(sim))


def plan(clock: int, limit_w: float, shared: bool = True, gpus: int = 2) -> Plan:
    placements = (
        (
            Placement(workload="a", share_pct=60, rate_rps=1),
            Placement(workload="b", share_pct=40, rate_rps=1),
        )
        if shared
        else (Placement(workload="a", rate_rps=1),)
    )
    return Plan(
        instance="t",
        gpus=tuple(
            GpuPlan(
                gpu=f"g{i}",
                type=H100,
                on=True,
                clock_mhz=clock,
                power_limit_w=limit_w,
                placements=placements,
            )
            for i in range(gpus)
        ),
    )


def apply(
    ctx: Ctx, sim: SimulatedNvml, p: Plan, cp: Path, mapping: dict[str, str] | None = None
) -> None:
    actions = plan_actions(p, sim, CAT, mapping, mps_base="/run/eo").actions
    Transaction(ctx, actions, cp).run()


def test_reapply_keeps_the_state_before_the_first_apply(tmp_path: Path) -> None:
    sim, ctx = host()
    before = sim.snapshot()
    apply(ctx, sim, plan(1200, 400), tmp_path / "cp1.json")
    apply(ctx, sim, plan(990, 300, shared=False), tmp_path / "cp2.json")
    originals = {(a.index, a.kind): o for a, o in read_checkpoint(tmp_path / "cp2.json")}
    assert originals[(0, "lock_clocks")] is None  # not the 1200 MHz of the first apply
    assert originals[(0, "power_limit")] == before[0]["power_limit_mw"]
    assert originals[(0, "mps")] == {"running": False, "default_pct": None}  # carried over
    assert json.loads((tmp_path / "cp2.json").read_text())["chained_from"] == [
        str(tmp_path / "cp1.json")
    ]
    _, errors = restore(ctx, tmp_path / "cp2.json")
    assert errors == [] and sim.snapshot() == before


def test_settings_an_apply_no_longer_touches_are_carried_over(tmp_path: Path) -> None:
    sim, ctx = host()
    before = sim.snapshot()
    apply(ctx, sim, plan(1200, 400), tmp_path / "cp1.json")
    apply(ctx, sim, plan(990, 300, gpus=1), tmp_path / "cp2.json", {"g0": "0"})
    assert {a.index for a, _ in read_checkpoint(tmp_path / "cp2.json")} == {0, 1}
    _, errors = restore(ctx, tmp_path / "cp2.json")
    assert errors == [] and sim.snapshot() == before


def test_a_change_made_by_hand_between_applies_is_the_new_original(tmp_path: Path) -> None:
    sim, ctx = host(1)
    apply(ctx, sim, plan(1200, 400, shared=False, gpus=1), tmp_path / "cp1.json")
    sim.set_power_limit(0, 250_000)  # an operator's change after the first apply
    apply(ctx, sim, plan(1200, 300, shared=False, gpus=1), tmp_path / "cp2.json")
    originals = {a.kind: o for a, o in read_checkpoint(tmp_path / "cp2.json")}
    assert originals["power_limit"] == 250_000
    assert originals["lock_clocks"] is None  # still the first apply's target: chained


def test_apply_after_a_restore_records_the_restored_state(tmp_path: Path) -> None:
    sim, ctx = host(1)
    before = sim.snapshot()
    apply(ctx, sim, plan(1200, 400, shared=False, gpus=1), tmp_path / "cp1.json")
    restore(ctx, tmp_path / "cp1.json")
    apply(ctx, sim, plan(990, 300, shared=False, gpus=1), tmp_path / "cp2.json")
    _, errors = restore(ctx, tmp_path / "cp2.json")
    assert errors == [] and sim.snapshot() == before


@pytest.fixture
def good_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A checkpoint of a simulated CLI apply (MPS included); cwd is tmp_path."""
    state = tmp_path / "sim.json"
    monkeypatch.setenv("ENERGYOPT_NVML_BACKEND", "sim")
    monkeypatch.setenv("ENERGYOPT_NVML_SIM_GPUS", f"{H100}x2")
    monkeypatch.setenv("ENERGYOPT_NVML_SIM_STATE", str(state))
    monkeypatch.chdir(tmp_path)
    from energyopt.spec.io import dump

    dump(plan(1200, 400), tmp_path / "plan.json")
    assert main(["apply", "plan.json", "--apply", "--checkpoint", "good.json"]) == 0
    data: dict[str, Any] = json.loads((tmp_path / "good.json").read_text())
    return data


def _mps_index(data: dict[str, Any]) -> int:
    return next(i for i, e in enumerate(data["entries"]) if e["action"]["kind"] == "mps")


def _broken(data: dict[str, Any], how: str) -> dict[str, Any]:
    bad = copy.deepcopy(data)
    m = _mps_index(bad)
    if how == "entries-null":
        bad["entries"] = None
    elif how == "entries-string":
        bad["entries"] = "all of them"
    elif how == "entries-missing":
        del bad["entries"]
    elif how == "entry-not-object":
        bad["entries"][0] = 7
    elif how == "no-action":
        del bad["entries"][0]["action"]
    elif how == "no-original":
        del bad["entries"][0]["original"]
    elif how == "pipe-dir-int":
        bad["entries"][m]["action"]["pipe_dir"] = 5
    elif how == "log-dir-list":
        bad["entries"][m]["action"]["log_dir"] = ["/tmp"]
    elif how == "pipe-dir-empty":
        bad["entries"][m]["action"]["pipe_dir"] = ""
    elif how == "mps-original-string":
        bad["entries"][m]["original"] = "running"
    elif how == "persistence-original":
        bad["entries"][0]["original"] = "off"
    elif how == "unknown-kind":
        bad["entries"][0]["action"]["kind"] = "fan_speed"
    elif how == "index-string":
        bad["entries"][0]["action"]["index"] = "0"
    return bad


FIELDS = {
    "entries-null": "entries: expected a list of settings, got null",
    "entries-string": "entries: expected a list of settings, got a string",
    "entries-missing": "entries: missing",
    "entry-not-object": "entries[0]: expected an object",
    "no-action": "entries[0].action: missing",
    "no-original": "entries[0].original: missing",
    "pipe-dir-int": "].action.pipe_dir: expected a string, got an integer",
    "log-dir-list": "].action.log_dir: expected a string, got a list",
    "pipe-dir-empty": "].action.pipe_dir: empty",
    "mps-original-string": "].original: expected an object, got a string",
    "persistence-original": "entries[0].original: expected a boolean, got a string",
    "unknown-kind": "entries[0].action.kind: unknown action 'fan_speed'",
    "index-string": "entries[0].action.index: expected an integer, got a string",
}


@pytest.mark.parametrize("how", sorted(FIELDS))
def test_restore_names_file_and_field_of_a_bad_checkpoint(
    how: str, good_checkpoint: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    sim_state = Path("sim.json").read_text()
    Path("bad.json").write_text(json.dumps(_broken(good_checkpoint, how)))
    capsys.readouterr()
    assert main(["restore", "bad.json"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("energyopt restore: bad.json: ")
    assert FIELDS[how] in lines[0]
    assert "was restored" not in captured.out + captured.err
    assert Path("sim.json").read_text() == sim_state  # nothing was written


def test_the_good_checkpoint_restores(good_checkpoint: dict[str, Any]) -> None:
    assert main(["restore", "good.json"]) == 0
    state = json.loads(Path("sim.json").read_text())
    assert state["mps"] == {} and all(d["locked"] is None for d in state["devices"])


def test_checkpoint_written_before_placements_were_recorded_still_restores(tmp_path: Path) -> None:
    sim = SimulatedNvml([CAT.gpu("A100-SXM4-80GB")])
    ctx = Ctx(sim, SimMps(sim))
    sim.set_mig_mode(0, True)
    sim.create_gpu_instance(0, "3g.40gb")
    action = {"gpu": "g", "index": 0, "uuid": sim.uuid(0), "kind": "mig", "enabled": True}
    old = {
        "version": 1,
        "backend": "sim",
        "entries": [
            {
                "action": {**action, "instances": ["3g.40gb", "3g.40gb"]},
                "original": {"enabled": True, "instances": ["7g.80gb"]},
            }
        ],
    }
    cp = tmp_path / "old.json"
    cp.write_text(json.dumps(old))
    _, errors = restore(ctx, cp)
    assert errors == [] and sim.list_gpu_instances(0) == (("7g.80gb", 0),)
    n = len(sim.writes)
    assert restore(ctx, cp)[1] == [] and len(sim.writes) == n  # same profiles: no writes
