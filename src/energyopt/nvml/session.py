"""Open the backend the CLI uses: real NVML, or the simulated one.

``ENERGYOPT_NVML_BACKEND=sim`` selects the simulated host. Its GPUs come from
``ENERGYOPT_NVML_SIM_GPUS`` (comma-separated catalog names, ``NAMExN`` repeats;
default ``H100-SXM5-80GBx4``), and ``ENERGYOPT_NVML_SIM_STATE=FILE`` keeps its state
between commands (so ``apply``, ``status`` and ``restore`` see the same GPUs).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from energyopt.catalog import builtin_catalog
from energyopt.nvml.actions import Ctx
from energyopt.nvml.backend import Clock
from energyopt.nvml.errors import BackendUnavailable
from energyopt.nvml.mps import SubprocessMps
from energyopt.nvml.sim import SimClock, SimMps, SimulatedNvml

DEFAULT_SIM_GPUS = "H100-SXM5-80GBx4"


class RealClock:
    """Wall-clock time."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class SimRealtimeClock:
    """Real time that also advances a simulated host (to measure a real command)."""

    def __init__(self, sim: SimulatedNvml) -> None:
        self.sim = sim

    def now(self) -> float:
        return self.sim.time_s

    def sleep(self, seconds: float) -> None:
        start = time.monotonic()
        time.sleep(seconds)
        self.sim.advance(time.monotonic() - start)


@dataclass
class Session:
    """An open backend, the MPS control, and the clocks to measure with."""

    ctx: Ctx
    clock: Clock
    command_clock: Clock


def parse_sim_gpus(spec: str) -> list[str]:
    """``A100-SXM4-80GBx2,L4`` -> ['A100-SXM4-80GB', 'A100-SXM4-80GB', 'L4']."""
    out: list[str] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, sep, count = part.rpartition("x")
        if sep and count.isdigit() and name:
            out.extend([name] * int(count))
        else:
            out.append(part)
    return out


def _open_sim(env: Mapping[str, str]) -> SimulatedNvml:
    catalog = builtin_catalog()
    state = env.get("ENERGYOPT_NVML_SIM_STATE")
    if state and Path(state).exists():
        return SimulatedNvml.from_json(json.loads(Path(state).read_text()), catalog.gpus)
    try:
        gpus = [catalog.gpu(n) for n in parse_sim_gpus(env.get("ENERGYOPT_NVML_SIM_GPUS", ""))]
    except KeyError as exc:
        raise BackendUnavailable(f"ENERGYOPT_NVML_SIM_GPUS: {exc.args[0]}") from None
    if not gpus:
        gpus = [catalog.gpu(n) for n in parse_sim_gpus(DEFAULT_SIM_GPUS)]
    return SimulatedNvml(gpus)


@contextlib.contextmanager
def open_session(env: Mapping[str, str] | None = None) -> Iterator[Session]:
    """The backend chosen by ``ENERGYOPT_NVML_BACKEND`` (``sim``, or real NVML by default)."""
    env = os.environ if env is None else env
    kind = env.get("ENERGYOPT_NVML_BACKEND", "nvml").strip().lower()
    if kind == "sim":
        sim = _open_sim(env)
        try:
            yield Session(Ctx(sim, SimMps(sim)), SimClock(sim), SimRealtimeClock(sim))
        finally:
            state = env.get("ENERGYOPT_NVML_SIM_STATE")
            if state:
                sim.save(state)
        return
    if kind not in ("nvml", "real", ""):
        raise BackendUnavailable(
            f"ENERGYOPT_NVML_BACKEND={kind!r}: use 'nvml' (real GPUs) or 'sim' (simulated)"
        )
    from energyopt.nvml.real import NvmlBackend

    real = NvmlBackend()
    real.open()
    try:
        yield Session(Ctx(real, SubprocessMps()), RealClock(), RealClock())
    finally:
        real.close()
