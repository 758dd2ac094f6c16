"""Simulated NVML constraints, measurement, status, and the real backend's error mapping."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from energyopt.catalog import builtin_catalog
from energyopt.nvml.errors import (
    BackendUnavailable,
    MpsError,
    NoPermission,
    NotSupported,
    NvmlCallFailed,
    PowerLimitOutOfRange,
)
from energyopt.nvml.measure import format_status, format_windows, gpu_status, measure
from energyopt.nvml.mps import SubprocessMps
from energyopt.nvml.names import name_matches
from energyopt.nvml.real import translate
from energyopt.nvml.session import open_session, parse_sim_gpus
from energyopt.nvml.sim import SimClock, SimulatedNvml
from energyopt.perf.power import gpu_on_power_w

CAT = builtin_catalog()


@pytest.mark.parametrize("name", sorted(CAT.gpus))
def test_sim_has_catalog_constraints(name: str) -> None:
    g = CAT.gpu(name)
    sim = SimulatedNvml([g])
    assert sim.supported_sm_clocks(0) == g.sm_clocks_mhz()
    lo, hi = sim.get_power_limit_constraints(0)
    assert (lo, hi) == (round(g.power_limit_min_w * 1000), round(g.power_limit_max_w * 1000))
    assert sim.mig_supported(0) == bool(g.mig_profiles)
    assert name_matches(g.name, sim.name(0))
    with pytest.raises(PowerLimitOutOfRange):
        sim.set_power_limit(0, hi + 1)
    if not g.mig_profiles:
        with pytest.raises(NotSupported, match="MIG mode is not supported"):
            sim.set_mig_mode(0, True)


def test_name_matching() -> None:
    assert name_matches("H100-SXM5-80GB", "NVIDIA H100 80GB HBM3")
    assert name_matches("A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB")
    assert name_matches("L4", "NVIDIA L4")
    assert not name_matches("L4", "NVIDIA L40S")


def test_energy_counter_advances_with_simulated_time() -> None:
    g = CAT.gpu("A100-SXM4-80GB")
    sim = SimulatedNvml([g, g])
    sim.set_locked_clocks(0, 900, 900)
    p0 = sim.get_power_usage(0)
    assert p0 == round(gpu_on_power_w(g, 900) * 1000)
    sim.set_load(1, 1.0)
    assert sim.get_power_usage(1) > p0
    sim.advance(10)
    assert sim.get_total_energy(0) == p0 * 10
    sim.set_power_limit(1, 150_000)
    assert sim.get_power_usage(1) == 150_000  # capped by the limit


def test_measure_seconds_on_simulated_time() -> None:
    g = CAT.gpu("H100-SXM5-80GB")
    sim = SimulatedNvml([g, g])
    sim.set_locked_clocks(0, 1200, 1200)
    sim.set_load(0, 0.5)
    windows, rc = measure(sim, SimClock(sim), seconds=5.0, interval_s=0.5)
    assert rc == 0 and sim.time_s == pytest.approx(5.0)
    w0, w1 = windows
    assert w0.seconds == pytest.approx(5.0)
    assert w0.energy_j == pytest.approx(sim.get_power_usage(0) / 1000 * 5, rel=1e-6)
    assert w0.avg_power_w == pytest.approx(w0.mean_sampled_power_w, rel=1e-6)
    assert w0.mean_sm_clock_mhz == 1200 and w0.min_sm_clock_mhz == w0.max_sm_clock_mhz == 1200
    assert w1.avg_power_w == pytest.approx(sim.get_power_usage(1) / 1000)  # idle, unlocked
    lines = format_windows(windows)
    assert lines[0].startswith("GPU 0  NVIDIA H100 80GB HBM3:") and "J in 5.00 s" in lines[0]
    assert lines[-1].startswith("total")


def test_measure_command() -> None:
    sim = SimulatedNvml([CAT.gpu("L4")])
    clock = SimClock(sim)
    windows, rc = measure(sim, clock, command=[sys.executable, "-c", "raise SystemExit(3)"])
    assert rc == 3 and len(windows) == 1


def test_measure_needs_seconds_or_command() -> None:
    sim = SimulatedNvml([CAT.gpu("L4")])
    with pytest.raises(Exception, match="--seconds N or -- COMMAND"):
        measure(sim, SimClock(sim))


def test_status_rows() -> None:
    g = CAT.gpu("A100-SXM4-80GB")
    sim = SimulatedNvml([g, CAT.gpu("L4")])
    sim.set_locked_clocks(0, 1005, 1005)
    sim.set_mig_mode(0, True)
    sim.create_gpu_instance(0, "3g.40gb")
    sim.advance(2)
    rows = [gpu_status(sim, i) for i in range(2)]
    assert rows[0].locked == "1005 MHz" and rows[0].sm_clock_mhz == 1005
    assert rows[0].mig == "on: 3g.40gb@0" and rows[1].mig == "n/a"
    assert rows[0].limit_min_w == 100 and rows[0].limit_max_w == 400
    assert rows[1].energy_j == pytest.approx(2 * sim.get_power_usage(1) / 1000)
    text = "\n".join(format_status(rows))
    assert "limit 400 W [100, 400]" in text and "energy counter" in text


class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def test_translate_nvml_errors() -> None:
    e = translate(FakeNvmlError(4), "GPU 0", "power limit")
    assert isinstance(e, NoPermission) and "run as root" in str(e) and "CAP_SYS_ADMIN" in str(e)
    e = translate(FakeNvmlError(3), "GPU 1 (NVIDIA L4)", "MIG mode")
    assert isinstance(e, NotSupported)
    assert str(e) == "GPU 1 (NVIDIA L4): MIG mode is not supported on this GPU"
    assert isinstance(translate(FakeNvmlError(9), "GPU 0", "x"), BackendUnavailable)
    e = translate(FakeNvmlError(999), "GPU 0", "locked SM clocks")
    assert isinstance(e, NvmlCallFailed) and "locked SM clocks failed" in str(e)


def test_pynvml_is_imported_lazily() -> None:
    code = (
        "import sys, energyopt.cli, energyopt.nvml, energyopt.nvml.real, energyopt.nvml.session;"
        "print('pynvml' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_real_backend_without_pynvml_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with (
        pytest.raises(BackendUnavailable, match=r"pip install 'energyopt\[nvml\]'"),
        open_session({"ENERGYOPT_NVML_BACKEND": "nvml"}),
    ):
        pass


def test_unknown_backend_name() -> None:
    with (
        pytest.raises(BackendUnavailable, match="use 'nvml'"),
        open_session({"ENERGYOPT_NVML_BACKEND": "cuda"}),
    ):
        pass


def test_sim_session_state_round_trip(tmp_path: Path) -> None:
    env = {
        "ENERGYOPT_NVML_BACKEND": "sim",
        "ENERGYOPT_NVML_SIM_GPUS": "A100-SXM4-80GBx2,L4",
        "ENERGYOPT_NVML_SIM_STATE": str(tmp_path / "sim.json"),
    }
    with open_session(env) as s:
        assert s.ctx.nvml.device_count() == 3
        s.ctx.nvml.set_power_limit(2, 50_000)
        s.ctx.mps.start("/p", "/l", s.ctx.nvml.uuid(0))
    with open_session(env) as s:
        assert s.ctx.nvml.get_power_limit(2) == 50_000
        assert s.ctx.mps.is_running("/p")
    assert parse_sim_gpus("L4x2, L40S") == ["L4", "L4", "L40S"]
    with (
        pytest.raises(BackendUnavailable, match="unknown GPU type"),
        open_session({"ENERGYOPT_NVML_BACKEND": "sim", "ENERGYOPT_NVML_SIM_GPUS": "B300"}),
    ):
        pass


def test_subprocess_mps_without_binary(tmp_path: Path) -> None:
    mps = SubprocessMps(binary="no-such-nvidia-cuda-mps-control")
    assert not mps.is_running(str(tmp_path / "pipe"))
    with pytest.raises(MpsError, match="not found"):
        mps.start(str(tmp_path / "pipe"), str(tmp_path / "log"), "GPU-x")


def test_gpucheck_helpers_and_no_gpu_exit(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from energyopt.nvml.gpucheck import main as check_main
    from energyopt.nvml.gpucheck import pick_clocks, predicted_power_w

    g = CAT.gpu("A100-SXM4-80GB")
    picks = pick_clocks(g.sm_clocks_mhz(), 4)
    assert len(picks) == 4 and picks[-1] == 1410 and picks[0] >= 0.4 * 1410
    assert all(c in g.sm_clocks_mhz() for c in picks)
    idle = predicted_power_w(g, 900, 0.0, 400)
    assert idle == pytest.approx(gpu_on_power_w(g, 900))
    assert idle < predicted_power_w(g, 900, 1.0, 400) < predicted_power_w(g, 1410, 1.0, 400)
    assert predicted_power_w(g, 1410, 1.0, 150) == 150
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert check_main([]) == 2
    assert "cannot run here" in capsys.readouterr().err
