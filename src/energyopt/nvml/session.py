"""Open the backend the CLI uses: real NVML, or the simulated one.

``ENERGYOPT_NVML_BACKEND=sim`` selects the simulated host. Its GPUs come from
``ENERGYOPT_NVML_SIM_GPUS`` (comma-separated catalog names, ``NAMExN`` repeats;
default ``H100-SXM5-80GBx4``). Its state is kept between commands (so ``apply``,
``status`` and ``restore`` see the same GPUs) in ``ENERGYOPT_NVML_SIM_STATE`` if set,
else in ``$XDG_STATE_HOME/energyopt/nvml-sim.json`` (``~/.local/state/energyopt/`` when
``XDG_STATE_HOME`` is unset); every command says where.
"""

from __future__ import annotations

import contextlib
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
from energyopt.spec.errors import SpecError
from energyopt.spec.hardware import GpuType

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
    where: str = ""
    """What the backend is and, for the simulated one, where its state is kept."""
    sim_state: Path | None = None
    """The simulated host's state file (None for real NVML)."""
    fresh: bool = False
    """True for a simulated host that no earlier command saved (all settings default)."""


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


STATE_ENV = "ENERGYOPT_NVML_SIM_STATE"


def sim_state_path(env: Mapping[str, str]) -> Path:
    """Where the simulated host keeps its state: ``ENERGYOPT_NVML_SIM_STATE``, else
    ``energyopt/nvml-sim.json`` under ``$XDG_STATE_HOME`` (an absolute path), else under
    ``~/.local/state``. ``XDG_STATE_HOME`` and ``HOME`` missing from ``env`` are read
    from the process environment."""
    explicit = env.get(STATE_ENV, "").strip()
    if explicit:
        return Path(explicit)
    xdg = env.get("XDG_STATE_HOME") or os.environ.get("XDG_STATE_HOME", "")
    if xdg and Path(xdg).is_absolute():
        base = Path(xdg)
    else:
        home = env.get("HOME") or os.environ.get("HOME", "")
        base = (Path(home) if home else Path.home()) / ".local" / "state"
    return base / "energyopt" / "nvml-sim.json"


def _sim_gpus(env: Mapping[str, str]) -> list[GpuType] | None:
    """The GPUs ``ENERGYOPT_NVML_SIM_GPUS`` asks for; None when it is unset or empty."""
    catalog = builtin_catalog()
    try:
        gpus = [catalog.gpu(n) for n in parse_sim_gpus(env.get("ENERGYOPT_NVML_SIM_GPUS", ""))]
    except KeyError as exc:
        raise BackendUnavailable(f"ENERGYOPT_NVML_SIM_GPUS: {exc.args[0]}") from None
    return gpus or None


def _open_sim(env: Mapping[str, str], state: Path) -> tuple[SimulatedNvml, bool]:
    """The simulated host saved in ``state``, or a new one; True when it is new."""
    asked = _sim_gpus(env)
    try:
        os.lstat(state)
        saved_before = True
    except (FileNotFoundError, NotADirectoryError):
        saved_before = False
    except OSError:
        saved_before = True  # cannot look: reading it names the file and the reason
    if saved_before:
        try:
            sim = SimulatedNvml.load(state, builtin_catalog().gpus)
        except SpecError as exc:
            raise SpecError(
                [
                    *exc.problems,
                    f"{state}: not a simulated host's state ({STATE_ENV} or its default "
                    "place); remove it to start a new simulated host",
                ]
            ) from None
        saved = [g.name for g in sim.types]
        if asked is not None and [g.name for g in asked] != saved:
            raise BackendUnavailable(
                f"ENERGYOPT_NVML_SIM_GPUS asks for {', '.join(g.name for g in asked)}, but the "
                f"simulated host saved in {state} has {', '.join(saved)}; remove {state} to "
                f"start a new host, or set {STATE_ENV} to another file"
            )
        return sim, False
    if asked is None:
        asked = [builtin_catalog().gpu(n) for n in parse_sim_gpus(DEFAULT_SIM_GPUS)]
    return SimulatedNvml(asked), True


@contextlib.contextmanager
def open_session(env: Mapping[str, str] | None = None) -> Iterator[Session]:
    """The backend chosen by ``ENERGYOPT_NVML_BACKEND`` (``sim``, or real NVML by default)."""
    env = os.environ if env is None else env
    kind = env.get("ENERGYOPT_NVML_BACKEND", "nvml").strip().lower()
    if kind == "sim":
        state = sim_state_path(env)
        sim, fresh = _open_sim(env, state)
        new = " (a new host: no state was saved there)" if fresh else ""
        where = f"simulated NVML, state in {state}{new}; {STATE_ENV}=FILE keeps it elsewhere"
        try:
            yield Session(
                Ctx(sim, SimMps(sim)), SimClock(sim), SimRealtimeClock(sim), where, state, fresh
            )
        except BaseException:
            # a command refused before it used a new host leaves no state behind (a later
            # restore would take that untouched host for one it had seen)
            if not fresh:
                sim.save(state)
            raise
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
        yield Session(Ctx(real, SubprocessMps()), RealClock(), RealClock(), "NVML")
    finally:
        real.close()
