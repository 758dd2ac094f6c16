"""The CLI on the real backend (nvidia-ml-py) over a fake NVML driver.

pynvml's own wrappers run; only the C functions are faked (tests/nvml_fake.py),
and MPS runs through the real ``SubprocessMps`` against a fake
``nvidia-cuda-mps-control`` on PATH. Every scenario ends with an exact
comparison of every setting with the state before.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pynvml")

from energyopt.catalog import builtin_catalog
from energyopt.cli import main
from energyopt.spec import GpuPlan, Placement, Plan
from energyopt.spec.io import dump

from .nvml_fake import (
    ERROR_NO_PERMISSION,
    FAKE_MPS_CONTROL,
    FakeDriver,
    mps_state,
)

CAT = builtin_catalog()
A100, H100, H200 = "A100-SXM4-80GB", "H100-SXM5-80GB", "H200-SXM-141GB"
GI_1SLICE, GI_ME, GI_2SLICE, GI_7SLICE = 0x0, 0x7, 0x1, 0x4  # NVML_GPU_INSTANCE_PROFILE_*


class Rig:
    """A fake host: the driver, the MPS base directory, and the CLI run on them."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp = tmp
        self.monkeypatch = monkeypatch
        self.mps = tmp / "mps"
        self.driver = FakeDriver([])
        self.runs = 0

    def host(self, *types: str) -> FakeDriver:
        self.driver = FakeDriver([CAT.gpu(t) for t in types])
        self.driver.install(self.monkeypatch)
        return self.driver

    def state(self) -> tuple[Any, Any]:
        return self.driver.snapshot(), mps_state(self.mps)

    def plan(self, *gpus: GpuPlan) -> Path:
        self.runs += 1
        path = self.tmp / f"plan{self.runs}.json"
        dump(Plan(instance="t", gpus=gpus), path)
        return path

    def cli(self, *args: str) -> int:
        extra = ["--mps-dir", str(self.mps)] if args[0] == "apply" else []
        return main([*args, *extra])


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Rig:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "nvidia-cuda-mps-control"
    tool.write_text(FAKE_MPS_CONTROL.format(python=sys.executable))
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("ENERGYOPT_NVML_BACKEND", "nvml")
    monkeypatch.chdir(tmp_path)
    return Rig(tmp_path, monkeypatch)


def clock(gpu_type: str, fraction: float) -> int:
    clocks = CAT.gpu(gpu_type).sm_clocks_mhz()
    return clocks[round(fraction * (len(clocks) - 1))]


def gpu(name: str, gtype: str, limit_w: float, *placements: Placement, f: float = 0.6) -> GpuPlan:
    return GpuPlan(
        gpu=name,
        type=gtype,
        on=True,
        clock_mhz=clock(gtype, f),
        power_limit_w=limit_w,
        placements=placements,
    )


def mps(workload: str, pct: int) -> Placement:
    return Placement(workload=workload, share_pct=pct, rate_rps=1.0)


def mig(workload: str, profile: str) -> Placement:
    return Placement(workload=workload, mig_profile=profile, rate_rps=1.0)


def entries(path: Path) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(path.read_text())["entries"]
    return data


def h100x4_plan(rig: Rig) -> Path:
    return rig.plan(
        gpu("n0/0", H100, 400, mps("chat", 75), mps("code", 25)),
        gpu("n0/1", H100, 500, mps("chat", 100), f=0.8),
        GpuPlan(gpu="n0/2", type=H100, on=False),
        gpu("n0/3", H100, 350, mps("search", 50), f=0.4),
    )


def test_h100x4_mps_status_dry_run_apply_reapply_measure_restore(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    drv = rig.host(H100, H100, H100, H100)
    before = rig.state()
    assert rig.cli("status") == 0
    out = capsys.readouterr().out
    assert out.count("NVIDIA H100 80GB HBM3") == 4 and "MIG off" in out
    plan = h100x4_plan(rig)
    assert rig.cli("apply", str(plan)) == 0
    assert "dry run" in capsys.readouterr().out
    assert drv.writes == [] and rig.state() == before

    assert rig.cli("apply", str(plan), "--apply", "--checkpoint", "cp1.json") == 0
    g = drv.gpus
    assert [x.persistence for x in g] == [True, True, False, True]
    assert g[0].locked == (clock(H100, 0.6),) * 2 and g[1].locked == (clock(H100, 0.8),) * 2
    assert [x.power_limit_mw for x in g] == [400_000, 500_000, 700_000, 350_000]
    daemons = rig.state()[1]
    assert sorted(d["default_pct"] for d in daemons.values()) == [25, 50]
    assert {d["device"] for d in daemons.values()} == {g[0].uuid, g[3].uuid}

    # a re-apply in a new process rewrites the clock locks (NVML cannot read them)
    # and records no new originals: its checkpoint still leads to the first state
    assert rig.cli("apply", str(plan), "--apply", "--checkpoint", "cp2.json") == 0
    originals = {
        (e["action"]["index"], e["action"]["kind"]): e["original"]
        for e in entries(Path("cp2.json"))
    }
    assert originals[(0, "persistence")] is False
    assert originals[(0, "power_limit")] == 700_000
    assert originals[(0, "mps")] == {"running": False, "default_pct": None}

    assert rig.cli("measure", "--seconds", "0.05", "--interval", "0.01") == 0
    assert "total" in capsys.readouterr().out
    assert rig.cli("restore", "cp2.json") == 0
    assert rig.state() == before


def test_h200x2_apply_reapply_restore(rig: Rig, capsys: pytest.CaptureFixture[str]) -> None:
    drv = rig.host(H200, H200)
    before = rig.state()
    plan = rig.plan(gpu("a", H200, 600, mps("chat", 100)), gpu("b", H200, 450, mps("x", 100)))
    assert rig.cli("apply", str(plan)) == 0 and drv.writes == []
    assert rig.cli("apply", str(plan), "--apply", "--checkpoint", "cp1.json") == 0
    assert [x.power_limit_mw for x in drv.gpus] == [600_000, 450_000]
    assert all(x.mig_current == 0 and x.persistence for x in drv.gpus)
    assert rig.cli("apply", str(plan), "--apply", "--checkpoint", "cp2.json") == 0
    capsys.readouterr()
    assert rig.cli("restore", "cp2.json") == 0
    assert "at their original values" in capsys.readouterr().out
    assert rig.state() == before


def test_a100_mig_layout_created_in_the_order_its_placements_need(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    drv = rig.host(A100)
    before = rig.state()
    # fits only with the 3g instance at memory slice 4; the driver, left to choose,
    # puts a 1g instance at slice 6 first, and then no 3g instance fits
    layout = ("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb")
    plan = rig.plan(gpu("a", A100, 300, *(mig(f"w{i}", p) for i, p in enumerate(layout))))
    assert rig.cli("apply", str(plan)) == 0
    assert "3g.40gb at memory slice 4" in capsys.readouterr().out
    assert rig.cli("apply", str(plan), "--apply", "--checkpoint", "cp1.json") == 0
    gis = sorted(
        (gi.profile, gi.start, gi.size, sorted(gi.cis.values())) for gi in drv.gpus[0].gis.values()
    )
    # profile ids: 9 = 3g, 14 = 2g, 19 = 1g; each with one compute instance of all its slices
    assert gis == [(9, 4, 4, [2]), (14, 0, 2, [1]), (19, 2, 1, [0]), (19, 3, 1, [0])]
    assert rig.cli("status") == 0
    assert "MIG on: 1g.10gb@2, 1g.10gb@3, 2g.20gb@0, 3g.40gb@4" in capsys.readouterr().out
    assert rig.cli("measure", "--seconds", "0.05", "--interval", "0.01") == 0
    assert "NVIDIA A100-SXM4-80GB" in capsys.readouterr().out
    n = len(drv.writes)
    assert rig.cli("apply", str(plan), "--apply", "--checkpoint", "cp2.json") == 0
    assert not [w for w in drv.writes[n:] if "Instance" in w or "Mig" in w]
    assert rig.cli("restore", "cp2.json") == 0
    assert rig.state() == before


def test_h200_layouts_someone_else_made_are_replaced_and_restored_exactly(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    drv = rig.host(H200, H200)
    for g in drv.gpus:
        g.mig_current = g.mig_pending = 1
    drv.make_instance(0, GI_2SLICE, 0)
    drv.make_instance(0, GI_ME, 3)
    drv.make_instance(0, GI_1SLICE, 6)
    drv.make_instance(1, GI_ME, 5)  # only a +me instance: MIG off needs it gone
    before = rig.state()
    assert rig.cli("status") == 0
    out = capsys.readouterr().out
    assert "MIG on: 1g.18gb@6, 1g.18gb+me@3, 2g.35gb@0" in out and "1g.18gb+me@5" in out
    plan = rig.plan(
        gpu("a", H200, 600, mig("chat", "4g.71gb"), mig("code", "3g.71gb")),
        gpu("b", H200, 500, mps("x", 100)),
    )
    assert rig.cli("apply", str(plan), "--apply", "--checkpoint", "cp.json") == 0
    assert sorted((gi.profile, gi.start) for gi in drv.gpus[0].gis.values()) == [(5, 0), (9, 4)]
    assert drv.gpus[1].mig_current == 0 and not drv.gpus[1].gis
    assert rig.cli("restore", "cp.json") == 0
    assert rig.state() == before


def test_pending_mig_mode_change_stops_before_any_write(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    drv = rig.host(H200)
    drv.gpus[0].mig_pending = 1  # someone ran `nvidia-smi -mig 1` and did not reset
    before = rig.state()
    assert rig.cli("status") == 0
    assert "enable pending" in capsys.readouterr().out
    plan = rig.plan(gpu("a", H200, 600, mig("chat", "7g.141gb")))
    for args in ([], ["--apply"]):
        assert rig.cli("apply", str(plan), *args) == 5
        err = capsys.readouterr().err
        assert "pending" in err and "nvidia-smi -r -i 0" in err and "-mig 0" in err
    assert drv.writes == [] and rig.state() == before


def test_mig_mode_change_needing_a_reset_is_withdrawn_and_rolled_back(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    drv = rig.host(A100)
    drv.gpus[0].mig_needs_reset = True
    before = rig.state()
    plan = rig.plan(gpu("a", A100, 300, mig("chat", "7g.80gb")))
    assert rig.cli("apply", str(plan), "--apply", "--checkpoint", "cp.json") == 5
    err = capsys.readouterr().err
    assert "needs a GPU reset" in err and "every setting it changed was restored" in err
    assert rig.state() == before


def test_lock_refused_and_reset_refused_is_not_an_incomplete_restore(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    drv = rig.host(H100)
    drv.gpus[0].clocks_supported = False
    before = rig.state()
    plan = rig.plan(gpu("a", H100, 500, mps("chat", 100)))
    assert rig.cli("apply", str(plan), "--apply", "--checkpoint", "cp.json") == 5
    err = capsys.readouterr().err
    assert "locked SM clocks is not supported" in err
    assert "every setting it changed was restored" in err and "INCOMPLETE" not in err
    assert rig.state() == before


def refused_host(rig: Rig) -> tuple[FakeDriver, Path]:
    drv = rig.host(A100, H100)
    plan = rig.plan(
        gpu("a", A100, 300, mig("chat", "3g.40gb"), mig("code", "2g.20gb"), mig("s", "1g.20gb")),
        gpu("b", H100, 500, mps("chat", 60), mps("code", 40)),
    )
    return drv, plan


def test_refused_write_at_every_call_of_an_apply_restores_everything(
    rig: Rig, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = rig.tmp / "mps-calls"
    monkeypatch.setenv("FAKE_MPS_COUNTER", str(counter))
    drv, plan = refused_host(rig)
    assert rig.cli("apply", str(plan), "--apply", "--checkpoint", "count.json") == 0
    nvml_writes, mps_calls = len(drv.writes), int(counter.read_text())
    assert nvml_writes == 13  # 2 persistence, MIG mode, 3 GI + 3 CI, 2 clocks, 2 limits
    assert mps_calls == 4  # start the daemon, read and set its default, read it back
    faults = [("nvml", k) for k in range(nvml_writes)] + [("mps", k) for k in range(mps_calls)]
    for where, k in faults:
        drv, plan = refused_host(rig)
        for d in rig.mps.glob("*/pipe/control"):
            d.unlink()
        counter.unlink(missing_ok=True)
        before = rig.state()
        if where == "nvml":
            drv.fail_write(k, ERROR_NO_PERMISSION)
            monkeypatch.delenv("FAKE_MPS_FAIL_AT", raising=False)
        else:
            monkeypatch.setenv("FAKE_MPS_FAIL_AT", str(k))
        capsys.readouterr()
        cp = f"cp-{where}{k}.json"
        assert rig.cli("apply", str(plan), "--apply", "--checkpoint", cp) == 5, (where, k)
        err = capsys.readouterr().err
        assert "every setting it changed was restored" in err, (where, k, err)
        assert ("no permission" if where == "nvml" else "injected fault") in err, (where, k)
        assert rig.state() == before, (where, k)
