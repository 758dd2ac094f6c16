"""The simulator's node agent: the online control's clock, power-limit and share
changes reach the simulated fleet through the same ``GpuControl`` interface, and the
same checks, as they reach a real GPU through the node agent (``energyopt.agent``).

The envelope of a simulated GPU is what its type and the instance allow: clocks in the
type's range and among the instance's candidate clocks (those plans choose from),
power limits in the type's range and at most the GPU's power cap; MPS shares only for
the instances on that GPU, never raising its total above 100 %. A change outside it
is refused (``energyopt.control.Refused``) and nothing in the simulation
changes. Units: MHz, W, percent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from energyopt.control import Refused, check_setting, check_shares
from energyopt.perf.oppoints import candidate_clocks

if TYPE_CHECKING:
    from energyopt.sim.engine import Simulator


class SimulatedAgent:
    """``GpuControl`` on the simulator ``sim`` at its current time (``sim.now``)."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.clocks_mhz: dict[str, tuple[int, ...]] = {}
        for gid, g in sim.gpus.items():
            self.clocks_mhz[gid] = tuple(sorted(set(candidate_clocks(sim.problem, g.gtype))))
        self.changes = 0  # changes made

    def _gpu(self, gpu: str) -> str:
        if gpu not in self.sim.gpus:
            raise Refused("outside_envelope", f"gpu: {gpu!r} is not a GPU of the simulated fleet")
        return f"{gpu} (simulated)"

    def set_clock(self, gpu: str, clock_mhz: int) -> None:
        """Lock ``gpu`` at ``clock_mhz`` (MHz) within its type's range."""
        where = self._gpu(gpu)
        t = self.sim.gpus[gpu].gtype
        rng = (float(t.min_sm_clock_mhz), float(t.max_sm_clock_mhz))
        check_setting(
            where,
            "clock_mhz",
            clock_mhz,
            policy=rng,
            envelope=rng,
            envelope_of=f"the {t.name} type",
            supported_clocks_mhz=self.clocks_mhz[gpu],
        )
        self.sim.lock_clock(gpu, clock_mhz, self.sim.now)
        self.changes += 1

    def set_power_limit(self, gpu: str, limit_w: float) -> None:
        """Set ``gpu``'s power limit (W) within its type's range and its cap."""
        where = self._gpu(gpu)
        t = self.sim.gpus[gpu].gtype
        rng = (t.power_limit_min_w, t.power_limit_max_w)
        check_setting(
            where,
            "power_limit_w",
            limit_w,
            policy=rng,
            envelope=(t.power_limit_min_w, self.sim.caps[gpu]),
            envelope_of=f"{gpu}'s power cap",
            device_range_w=rng,
        )
        self.sim.set_power_limit(gpu, limit_w, self.sim.now)
        self.changes += 1

    def shift_shares(self, gpu: str, shares_pct: Mapping[str, int]) -> None:
        """Give the instances named in ``shares_pct`` (``Simulator.client_name``) these
        MPS shares (percent), all at once."""
        where = self._gpu(gpu)
        sim = self.sim
        if not sim.mps:
            raise Refused("not_supported", f"{where}: the instance does not share GPUs by MPS")
        clients = sim.mps_clients(gpu)
        check_shares(where, shares_pct, {name: pct for name, (_, pct) in clients.items()})
        for name, pct in shares_pct.items():
            sim.set_share(clients[name][0], pct, sim.now)
        self.changes += 1
