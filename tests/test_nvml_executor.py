"""Executor safety on the simulated NVML: dry run, idempotence, rollback, restore."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from energyopt.catalog import builtin_catalog
from energyopt.nvml.actions import Action, Ctx, LockClocks
from energyopt.nvml.errors import (
    ApplyFailed,
    ApplyInterrupted,
    CheckpointError,
    ClockNotSupported,
    DeviceMapError,
    MigLayoutError,
    NoPermission,
    NotSupported,
    NvmlCallFailed,
    PowerLimitOutOfRange,
    VerifyFailed,
)
from energyopt.nvml.planner import mig_parted_config, mig_parted_yaml, plan_actions
from energyopt.nvml.sim import SimMps, SimulatedNvml
from energyopt.nvml.transaction import Transaction, read_checkpoint, restore
from energyopt.spec import GpuPlan, Placement, Plan

CAT = builtin_catalog()
A100 = "A100-SXM4-80GB"
H100 = "H100-SXM5-80GB"


def host(*types: str, privileged: bool = True) -> tuple[SimulatedNvml, Ctx]:
    sim = SimulatedNvml([CAT.gpu(t) for t in types], privileged=privileged)
    return sim, Ctx(sim, SimMps(sim))


def place(workload: str, share: int = 100, mig: str | None = None) -> Placement:
    return Placement(workload=workload, share_pct=share, mig_profile=mig, rate_rps=1.0)


def full_plan() -> Plan:
    """Every action kind: MIG on GPU a, MPS on GPU b, plain on c, d off."""
    return Plan(
        instance="test",
        gpus=(
            GpuPlan(
                gpu="a",
                type=A100,
                on=True,
                clock_mhz=900,
                power_limit_w=129,
                placements=(
                    place("chat", mig="3g.40gb"),
                    place("code", mig="2g.20gb"),
                    place("search", mig="1g.20gb"),
                ),
            ),
            GpuPlan(
                gpu="b",
                type=A100,
                on=True,
                clock_mhz=1110,
                power_limit_w=300,
                placements=(place("chat", 75), place("code", 25)),
            ),
            GpuPlan(
                gpu="c",
                type=H100,
                on=True,
                clock_mhz=1200,
                power_limit_w=400,
                placements=(place("chat"),),
            ),
            GpuPlan(gpu="d", type=H100, on=False),
        ),
    )


TYPES = (A100, A100, H100, H100)


def actions_for(sim: SimulatedNvml, plan: Plan | None = None) -> list[Action]:
    return plan_actions(plan or full_plan(), sim, CAT, mps_base="/run/eo-mps").actions


def count_writes(tmp: Path) -> int:
    sim, ctx = host(*TYPES)
    Transaction(ctx, actions_for(sim), tmp / "count.json").run()
    return len(sim.writes)


TOTAL_WRITES = 15  # checked by test_write_count


def test_write_count(tmp_path: Path) -> None:
    assert count_writes(tmp_path) == TOTAL_WRITES


def test_plan_makes_every_action_kind() -> None:
    sim, _ = host(*TYPES)
    kinds = [a.kind for a in actions_for(sim)]
    assert kinds == [
        "persistence", "mig", "lock_clocks", "power_limit",
        "persistence", "mig", "lock_clocks", "power_limit", "mps",
        "persistence", "mig", "lock_clocks", "power_limit",
    ]  # fmt: skip


def test_dry_run_reads_only() -> None:
    sim, ctx = host(*TYPES)
    before = sim.snapshot()
    acts = actions_for(sim)
    originals = [a.read(ctx) for a in acts]
    assert [a.describe() for a in acts]
    assert any(not a.is_noop(o) for a, o in zip(acts, originals, strict=True))
    assert sim.writes == []
    assert sim.snapshot() == before


def test_apply_then_reapply_makes_zero_writes(tmp_path: Path) -> None:
    sim, ctx = host(*TYPES)
    report = Transaction(ctx, actions_for(sim), tmp_path / "cp.json").run()
    assert report.checkpoint is not None and report.checkpoint.exists()
    dev = sim.devices
    assert dev[0].mig_mode
    assert sorted(dev[0].instances) == [("1g.20gb", 6), ("2g.20gb", 4), ("3g.40gb", 0)]
    assert dev[0].locked == (900, 900) and dev[0].power_limit_mw == 129_000
    assert dev[1].locked == (1110, 1110) and dev[1].persistence
    assert len(sim.mps_daemons) == 1
    assert next(iter(sim.mps_daemons.values())).default_pct == 25
    assert dev[3].persistence is False and dev[3].locked is None  # off in the plan
    n = len(sim.writes)
    again = Transaction(ctx, actions_for(sim), tmp_path / "cp2.json").run()
    assert len(sim.writes) == n
    assert again.applied == [] and again.checkpoint is None
    assert not (tmp_path / "cp2.json").exists()


@pytest.mark.parametrize("k", range(TOTAL_WRITES))
@pytest.mark.parametrize(
    "fault",
    [NvmlCallFailed("injected"), KeyboardInterrupt()],
    ids=["nvml-error", "sigint"],
)
def test_failure_at_every_write_restores_everything(
    tmp_path: Path, k: int, fault: BaseException
) -> None:
    sim, ctx = host(*TYPES)
    before = sim.snapshot()
    sim.fail_at_write(k, fault)
    expected = ApplyInterrupted if isinstance(fault, KeyboardInterrupt) else ApplyFailed
    with pytest.raises(expected) as info:
        Transaction(ctx, actions_for(sim), tmp_path / "cp.json").run()
    assert info.value.restored, str(info.value)
    assert "restored" in str(info.value)
    assert sim.snapshot() == before


@pytest.mark.parametrize("i", range(13))
def test_failure_after_each_action_restores_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, i: int
) -> None:
    """The action's own write succeeded, then it failed (read-back): it is undone too."""
    sim, ctx = host(*TYPES)
    before = sim.snapshot()
    acts = actions_for(sim)
    assert len(acts) == 13
    victim = acts[i]
    original_verify = type(victim).verify

    def verify(self: Action, c: Ctx) -> None:
        if self is victim:
            raise VerifyFailed("injected read-back mismatch")
        original_verify(self, c)

    monkeypatch.setattr(type(victim), "verify", verify)
    if victim.is_noop(victim.read(ctx)):
        pytest.skip("already in place: never applied, so never verified")
    with pytest.raises(ApplyFailed) as info:
        Transaction(ctx, acts, tmp_path / "cp.json").run()
    assert info.value.restored
    assert sim.snapshot() == before


def test_readback_mismatch_triggers_restore(tmp_path: Path) -> None:
    sim, ctx = host(*TYPES)
    before = sim.snapshot()
    sim.ignore("set_power_limit")  # the driver "accepts" but nothing changes
    with pytest.raises(ApplyFailed) as info:
        Transaction(ctx, actions_for(sim), tmp_path / "cp.json").run()
    assert isinstance(info.value.cause, VerifyFailed)
    assert "read back 400 W after setting 129 W" in str(info.value)
    assert sim.snapshot() == before


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_real_signal_during_apply_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int
) -> None:
    sim, ctx = host(*TYPES)
    before = sim.snapshot()
    handlers = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    real = sim.set_power_limit
    calls = []

    def set_power_limit(index: int, limit_mw: int) -> None:
        real(index, limit_mw)
        calls.append(index)
        if len(calls) == 2:
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(sim, "set_power_limit", set_power_limit)
    with pytest.raises(ApplyInterrupted) as info:
        Transaction(ctx, actions_for(sim), tmp_path / "cp.json").run()
    assert "interrupted" in str(info.value)
    assert info.value.restored
    assert sim.snapshot() == before
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers


def test_permission_error_says_root_or_cap_sys_admin(tmp_path: Path) -> None:
    sim, ctx = host(*TYPES, privileged=False)
    before = sim.snapshot()
    with pytest.raises(ApplyFailed) as info:
        Transaction(ctx, actions_for(sim), tmp_path / "cp.json").run()
    assert isinstance(info.value.cause, NoPermission)
    msg = str(info.value)
    assert "run as root" in msg and "CAP_SYS_ADMIN" in msg and "GPU 0" in msg
    assert sim.snapshot() == before


def test_unsupported_clock_lists_nearest_before_any_write() -> None:
    sim, _ = host(A100)
    plan = Plan(instance="t", gpus=(GpuPlan(gpu="a", type=A100, on=True, clock_mhz=901),))
    with pytest.raises(ClockNotSupported) as info:
        plan_actions(plan, sim, CAT)
    assert "900 MHz, 915 MHz" in str(info.value)
    assert info.value.nearest == (900, 915)
    assert sim.writes == []


def test_sim_rejects_unsupported_clock_directly() -> None:
    sim, _ = host("L4")
    with pytest.raises(ClockNotSupported, match="nearest supported clocks"):
        sim.set_locked_clocks(0, 1003, 1003)


@pytest.mark.parametrize("watts", [50, 401])
def test_power_limit_outside_constraints_rejected_before_any_write(watts: float) -> None:
    sim, _ = host(A100)
    plan = Plan(instance="t", gpus=(GpuPlan(gpu="a", type=A100, on=True, power_limit_w=watts),))
    with pytest.raises(PowerLimitOutOfRange, match=r"\[100, 400\] W"):
        plan_actions(plan, sim, CAT)
    assert sim.writes == []


def test_device_type_mismatch_refused() -> None:
    sim, _ = host("L4")
    plan = Plan(instance="t", gpus=(GpuPlan(gpu="x", type=A100, on=True),))
    with pytest.raises(DeviceMapError, match="--map x="):
        plan_actions(plan, sim, CAT)


def test_mapping_by_uuid_and_index() -> None:
    sim, _ = host("L4", A100, A100)
    plan = Plan(
        instance="t",
        gpus=(
            GpuPlan(gpu="p", type=A100, on=True, clock_mhz=900),
            GpuPlan(gpu="q", type=A100, on=True, clock_mhz=1005),
        ),
    )
    hp = plan_actions(plan, sim, CAT, {"p": sim.uuid(2), "q": "1"})
    assert hp.devices["p"].index == 2 and hp.devices["q"].index == 1
    locks = {a.index: a for a in hp.actions if isinstance(a, LockClocks)}
    assert locks[2].clock_mhz == 900 and locks[1].clock_mhz == 1005
    with pytest.raises(DeviceMapError, match="both map"):
        plan_actions(plan, sim, CAT, {"p": "1", "q": "1"})
    with pytest.raises(DeviceMapError, match="not in the plan"):
        plan_actions(plan, sim, CAT, {"zzz": "1"})
    with pytest.raises(DeviceMapError, match="has 3"):
        plan_actions(plan, sim, CAT, {"p": "7"})


def test_more_plan_gpus_than_devices_refused() -> None:
    sim, _ = host(A100)
    with pytest.raises(DeviceMapError, match="--map"):
        plan_actions(full_plan(), sim, CAT)


def test_mig_on_gpu_without_mig_is_not_supported() -> None:
    sim, _ = host("L4")
    plan = Plan(
        instance="t",
        gpus=(GpuPlan(gpu="a", type="L4", on=True, placements=(place("w", mig="1g.10gb"),)),),
    )
    with pytest.raises(NotSupported, match="MIG is not supported"):
        plan_actions(plan, sim, CAT)


def test_mig_layout_limits_checked() -> None:
    sim, _ = host(A100)
    three = tuple(place(f"w{i}", mig="3g.40gb") for i in range(3))
    plan = Plan(instance="t", gpus=(GpuPlan(gpu="a", type=A100, on=True, placements=three),))
    with pytest.raises(MigLayoutError, match="at most 2"):
        plan_actions(plan, sim, CAT)
    too_big = (place("a", mig="4g.40gb"), place("b", mig="3g.40gb"), place("c", mig="1g.10gb"))
    plan = Plan(instance="t", gpus=(GpuPlan(gpu="a", type=A100, on=True, placements=too_big),))
    with pytest.raises(MigLayoutError, match="8 of 7 compute slices"):
        plan_actions(plan, sim, CAT)
    sim.devices[0].mig_mode = True
    for _ in range(7):
        sim.create_gpu_instance(0, "1g.10gb")
    with pytest.raises(MigLayoutError, match="at most 7"):
        sim.create_gpu_instance(0, "1g.10gb")
    with pytest.raises(MigLayoutError, match=r"no room for 1g\.20gb"):
        sim.create_gpu_instance(0, "1g.20gb")


def test_existing_mig_layout_is_replaced_and_restored(tmp_path: Path) -> None:
    sim, ctx = host(*TYPES)
    sim.devices[0].mig_mode = True
    sim.devices[0].instances = [("7g.80gb", 0)]
    sim.devices[1].mig_mode = True  # plan b wants MIG off
    before = sim.snapshot()
    Transaction(ctx, actions_for(sim), tmp_path / "cp.json").run()
    assert sorted(n for n, _ in sim.devices[0].instances) == ["1g.20gb", "2g.20gb", "3g.40gb"]
    assert sim.devices[1].mig_mode is False
    count, errors = restore(ctx, tmp_path / "cp.json")
    assert errors == [] and count == 13
    assert sim.snapshot() == before


def test_restore_from_checkpoint_file(tmp_path: Path) -> None:
    sim, ctx = host(*TYPES)
    before = sim.snapshot()
    cp = tmp_path / "cp.json"
    Transaction(ctx, actions_for(sim), cp).run()
    data = json.loads(cp.read_text())
    assert data["version"] == 1 and len(data["entries"]) == 13
    assert len(read_checkpoint(cp)) == 13
    _, errors = restore(ctx, cp)
    assert errors == []
    assert sim.snapshot() == before
    n = len(sim.writes)
    restore(ctx, cp)  # restoring again changes nothing
    assert len(sim.writes) == n


def test_checkpoint_is_never_overwritten(tmp_path: Path) -> None:
    sim, ctx = host(*TYPES)
    cp = tmp_path / "cp.json"
    cp.write_text("{}")
    with pytest.raises(CheckpointError, match="exists"):
        Transaction(ctx, actions_for(sim), cp).run()
    assert sim.writes == []


def test_unwritable_checkpoint_changes_nothing(tmp_path: Path) -> None:
    sim, ctx = host(*TYPES)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(CheckpointError, match="nothing was changed"):
        Transaction(ctx, actions_for(sim), blocker / "cp.json").run()
    assert sim.writes == []


def test_bad_checkpoint_file(tmp_path: Path) -> None:
    _, ctx = host(A100)
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 99}')
    with pytest.raises(CheckpointError, match="not an energyopt checkpoint"):
        restore(ctx, bad)
    with pytest.raises(CheckpointError, match="cannot read"):
        restore(ctx, tmp_path / "missing.json")


def test_mig_parted_yaml() -> None:
    sim, _ = host(*TYPES)
    hp = plan_actions(full_plan(), sim, CAT)
    cfg = mig_parted_config(full_plan(), hp.devices, "serving")
    assert cfg == {
        "version": "v1",
        "mig-configs": {
            "serving": [
                {
                    "devices": [0],
                    "mig-enabled": True,
                    "mig-devices": {"1g.20gb": 1, "2g.20gb": 1, "3g.40gb": 1},
                }
            ]
        },
    }
    text = mig_parted_yaml(full_plan(), hp.devices, "serving")
    assert text.startswith("version: v1\nmig-configs:\n  serving:\n")


def test_mps_client_env() -> None:
    sim, _ = host(*TYPES)
    hp = plan_actions(full_plan(), sim, CAT, mps_base="/run/eo-mps")
    envs = dict(hp.client_envs["b"])
    uuid = sim.uuid(1)
    assert envs["chat"] == {
        "CUDA_MPS_PIPE_DIRECTORY": f"/run/eo-mps/{uuid}/pipe",
        "CUDA_MPS_LOG_DIRECTORY": f"/run/eo-mps/{uuid}/log",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "75",
        "CUDA_VISIBLE_DEVICES": uuid,
    }
    assert envs["code"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert "a" not in hp.client_envs and "c" not in hp.client_envs
