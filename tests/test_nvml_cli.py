"""`energyopt apply/restore/status/measure` on the simulated backend (sim)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from energyopt.catalog import builtin_catalog
from energyopt.cli import main
from energyopt.perf.power import gpu_on_power_w
from energyopt.spec import GpuPlan, Placement, Plan
from energyopt.spec.io import dump

A100 = "A100-SXM4-80GB"


@pytest.fixture
def simhost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A simulated host of two A100s whose state lives in a file; cwd is tmp_path."""
    state = tmp_path / "sim.json"
    monkeypatch.setenv("ENERGYOPT_NVML_BACKEND", "sim")
    monkeypatch.setenv("ENERGYOPT_NVML_SIM_GPUS", f"{A100}x2")
    monkeypatch.setenv("ENERGYOPT_NVML_SIM_STATE", str(state))
    monkeypatch.chdir(tmp_path)
    return state


def write_plan(path: Path, clock: int = 900, limit: float = 129.0) -> Path:
    plan = Plan(
        instance="mig-a100",
        gpus=(
            GpuPlan(
                gpu="node0/0",
                type=A100,
                on=True,
                clock_mhz=clock,
                power_limit_w=limit,
                placements=(
                    Placement(workload="chat", mig_profile="3g.40gb", rate_rps=2),
                    Placement(workload="code", mig_profile="2g.20gb", rate_rps=1),
                    Placement(workload="search", mig_profile="1g.20gb", rate_rps=1),
                ),
            ),
            GpuPlan(
                gpu="node0/1",
                type=A100,
                on=True,
                clock_mhz=1110,
                power_limit_w=300,
                placements=(
                    Placement(workload="a", share_pct=60, rate_rps=1),
                    Placement(workload="b", share_pct=40, rate_rps=1),
                ),
            ),
        ),
    )
    dump(plan, path)
    return path


def test_dry_run_prints_actions_and_changes_nothing(
    simhost: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status"]) == 0
    before = simhost.read_text()
    plan = write_plan(tmp_path / "plan.json")
    assert main(["apply", str(plan), "--mig-config", "mig.yaml"]) == 0
    out = capsys.readouterr().out
    assert "dry run" in out
    assert "lock SM clocks at 900 MHz (now unlocked)" in out
    assert "set power limit to 129 W (now 400 W)" in out
    assert (
        "enable MIG with instances 3g.40gb at memory slice 0, 2g.20gb at memory slice 4, "
        "1g.20gb at memory slice 6 (now MIG off)"
    ) in out
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60" in out
    assert simhost.read_text() == before
    assert not list(tmp_path.glob("energyopt-checkpoint-*.json"))
    assert (tmp_path / "mig.yaml").read_text().startswith("version: v1\nmig-configs:\n  mig-a100:")


def test_apply_reapply_restore(
    simhost: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["status"])
    original = json.loads(simhost.read_text())["devices"]
    plan = write_plan(tmp_path / "plan.json")
    assert main(["apply", str(plan), "--apply", "--checkpoint", "cp.json"]) == 0
    out = capsys.readouterr().out
    assert "applied 8 change(s)" in out and "energyopt restore cp.json" in out
    devices = json.loads(simhost.read_text())["devices"]
    assert devices[0]["locked"] == [900, 900] and devices[0]["mig_mode"] is True
    assert main(["apply", str(plan), "--apply", "--checkpoint", "cp2.json"]) == 0
    assert "nothing to change" in capsys.readouterr().out
    assert not (tmp_path / "cp2.json").exists()
    assert main(["status"]) == 0
    status = capsys.readouterr().out
    assert "SM clock 900 MHz (locked: 900 MHz)" in status and "limit 129 W [100, 400]" in status
    assert main(["restore", "cp.json"]) == 0
    assert "at their original values" in capsys.readouterr().out
    assert json.loads(simhost.read_text())["devices"] == original


def test_permission_error_is_a_message_not_a_traceback(
    simhost: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from energyopt.nvml.sim import SimulatedNvml

    cat = builtin_catalog()
    SimulatedNvml([cat.gpu(A100)] * 2, privileged=False).save(simhost)
    plan = write_plan(tmp_path / "plan.json")
    assert main(["apply", str(plan), "--apply", "--checkpoint", "cp.json"]) == 5
    err = capsys.readouterr().err
    assert "run as root or grant the process CAP_SYS_ADMIN" in err
    assert "every setting it changed was restored" in err
    assert "Traceback" not in err


def test_bad_clock_is_reported_before_any_change(
    simhost: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = write_plan(tmp_path / "plan.json", clock=1000)
    assert main(["apply", str(plan), "--apply"]) == 5
    err = capsys.readouterr().err
    assert "SM clock 1000 MHz is not supported; nearest supported clocks: 990 MHz, 1005 MHz" in err
    assert not list(tmp_path.glob("energyopt-checkpoint-*.json"))


def test_map_option_and_map_file(
    simhost: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = write_plan(tmp_path / "plan.json")
    assert main(["apply", str(plan), "--map", "node0/1=0"]) == 0
    out = capsys.readouterr().out
    assert "node0/1 -> GPU 0" in out and "node0/0 ->" not in out
    (tmp_path / "map.yaml").write_text("node0/0: 1\n")
    assert main(["apply", str(plan), "--map-file", "map.yaml"]) == 0
    assert "node0/0 -> GPU 1" in capsys.readouterr().out
    assert main(["apply", str(plan), "--map", "node0/0"]) == 2
    assert "expected PLAN_GPU=INDEX" in capsys.readouterr().err
    assert main(["apply", str(plan), "--map", "node9/9=0"]) == 2
    assert f"--map node9/9=0: node9/9 is not a GPU of {plan}" in capsys.readouterr().err


def test_measure_seconds_and_command(simhost: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["measure", "--seconds", "3"]) == 0
    out = capsys.readouterr().out
    gtype = builtin_catalog().gpu(A100)
    idle = round(gpu_on_power_w(gtype, gtype.min_sm_clock_mhz) * 1000) / 1000  # unlocked, no load
    assert f"{3 * idle:,.1f} J in 3.00 s, average {idle:.1f} W" in out
    assert json.loads(simhost.read_text())["time_s"] == pytest.approx(3.0)
    assert main(["measure", "--", sys.executable, "-c", "pass"]) == 0
    assert "total" in capsys.readouterr().out
    assert main(["measure"]) == 5
    assert "--seconds N or -- COMMAND" in capsys.readouterr().err


def test_restore_missing_checkpoint(simhost: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["restore", "nope.json"]) == 2
    assert "nope.json: cannot read: No such file" in capsys.readouterr().err


def test_restore_names_a_missing_checkpoint_before_nvml_starts(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On a host without NVML, restore of a mistyped path says the path is wrong
    (it said NVML could not start)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ENERGYOPT_NVML_BACKEND", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert main(["restore", "nope.json"]) == 2
    err = capsys.readouterr().err
    assert "nope.json: cannot read: No such file" in err and "NVML" not in err


def test_real_backend_missing_is_a_clear_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("ENERGYOPT_NVML_BACKEND", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert main(["status"]) == 5
    err = capsys.readouterr().err
    assert "nvidia-ml-py is not installed" in err and "ENERGYOPT_NVML_BACKEND=sim" in err
