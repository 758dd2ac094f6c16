"""Task-graph files: validation errors name file and field; the model's costs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from energyopt.families.taskgraph.formulations.generators import cholesky, lu, platform, stencil
from energyopt.families.taskgraph.formulations.loading import build_taskgraph, load_taskgraph
from energyopt.perf.forward import CLOCK_RESPONSE
from energyopt.spec.errors import SpecError
from tests.conftest import INSTANCES

TG = INSTANCES / "taskgraph"


def _base() -> dict[str, Any]:
    return {
        "kind": "taskgraph",
        "name": "t",
        "gpus": [{"name": "a", "type": "L4"}, {"name": "b", "type": "L4"}],
        "tasks": [
            {"name": "x", "flops": 1e10, "bytes": 1e8},
            {"name": "y", "flops": 1e10, "bytes": 1e8},
        ],
        "edges": [{"src": "x", "dst": "y", "bytes": 1e6}],
    }


def _errors(tmp_path: Path, data: dict[str, Any]) -> list[str]:
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as exc:
        load_taskgraph(path)
    assert all(line.startswith(f"{path}: ") for line in exc.value.problems)
    return exc.value.problems


def test_bundled_instances_load() -> None:
    files = sorted(TG.glob("*.yaml"))
    assert len(files) >= 5
    for path in files:
        tg = load_taskgraph(path)
        assert tg.n_tasks > 0 and tg.n_gpus > 0


def test_unknown_key_names_field(tmp_path: Path) -> None:
    data = _base()
    data["tasks"][0]["flop"] = 3
    assert any("tasks[0](x).flop" in line for line in _errors(tmp_path, data))


def test_edge_to_unknown_task(tmp_path: Path) -> None:
    data = _base()
    data["edges"].append({"src": "x", "dst": "nope"})
    assert any("edges[1].dst: unknown task 'nope'" in line for line in _errors(tmp_path, data))


def test_cycle_is_reported(tmp_path: Path) -> None:
    data = _base()
    data["edges"].append({"src": "y", "dst": "x"})
    assert any("edges: the graph has a cycle" in line for line in _errors(tmp_path, data))


def test_unknown_gpu_type(tmp_path: Path) -> None:
    data = _base()
    data["gpus"][1]["type"] = "L40"
    lines = _errors(tmp_path, data)
    assert any("gpus[1](b).type: unknown GPU type 'L40'" in line for line in lines)


def test_measured_power_below_idle(tmp_path: Path) -> None:
    data = _base()
    data["tasks"][0] = {
        "name": "x",
        "measured": [{"gpu_type": "L4", "clock_mhz": 1500, "time_ms": 1.0, "power_w": 5.0}],
    }
    assert any("below the L4 idle power" in line for line in _errors(tmp_path, data))


def test_task_no_gpu_can_run(tmp_path: Path) -> None:
    data = _base()
    data["tasks"][0] = {
        "name": "x",
        "measured": [{"gpu_type": "L40S", "clock_mhz": 1500, "time_ms": 1.0, "power_w": 90}],
    }
    lines = _errors(tmp_path, data)
    # Refused at the measured point that names a GPU type the platform lacks.
    assert any(
        "tasks[0](x).measured[0].gpu_type: no GPU of type 'L40S' in gpus" in line for line in lines
    )


def test_clock_outside_range(tmp_path: Path) -> None:
    data = _base()
    data["clocks_mhz"] = {"L4": [100, 2040]}
    assert any("clocks_mhz.L4: 100 MHz is outside" in line for line in _errors(tmp_path, data))


def test_disconnected_topology(tmp_path: Path) -> None:
    data = _base()
    data["links"] = [{"a": "a", "b": "sw", "bandwidth_gbps": 10}]
    assert any("GPUs 'a' and 'b' are not connected" in line for line in _errors(tmp_path, data))


def test_compute_bound_time_scales_with_clock_memory_bound_does_not() -> None:
    tg = build_taskgraph(cholesky(2, 4096, platform("L40S", 1)))
    o = tg.options[0][tg.task_names.index("syrk_0_1")]
    ratio = o.dur[0] / o.dur[-1]
    # all but the clock-independent share of compute time (fitted on Perseus) follows 1/f
    fixed = CLOCK_RESPONSE.compute_fixed
    expect = fixed + (1.0 - fixed) * o.clock_mhz[-1] / o.clock_mhz[0]
    assert ratio == pytest.approx(expect, rel=0.05)
    st = build_taskgraph(stencil(1, 1, 2**26, platform("L40S", 1)))
    s = st.options[0][0]
    assert s.dur[0] / s.dur[-1] < 1.05  # memory-bound: the clock barely matters
    assert s.dyn_j[0] < 0.5 * s.dyn_j[-1]  # ... but its power does


def test_power_rises_with_clock_and_stays_below_tdp() -> None:
    tg = build_taskgraph(lu(2, 2048, platform("L4", 1)))
    gpu = tg.types[0]
    for o in tg.options[0]:
        assert list(o.active_w) == sorted(o.active_w)
        assert all(gpu.idle_w < w <= gpu.tdp_w + 1e-9 for w in o.active_w)


def test_transfers_cross_links_only_between_gpus() -> None:
    tg = build_taskgraph(cholesky(2, 1024, platform("L4", 2)))
    assert tg.transfer(4e6, 0, 0) == 0
    # default topology: both GPUs on one PCIe root, 32 GB/s, 2 x 0.01 ms latency
    expected_ms = 0.02 + 4e6 / 32e9 * 1e3
    assert tg.ms(tg.transfer(4e6, 0, 1)) == pytest.approx(expected_ms, abs=tg.unit_ms)
