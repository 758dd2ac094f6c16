"""The interface through which the online control changes a GPU's settings, and the
checks every implementation applies before a setting reaches a GPU.

``GpuControl`` is implemented by the node agent's client (``energyopt.agent.AgentClient``:
a real GPU through the agent) and by the simulator's in-process agent
(``energyopt.sim.control.SimulatedAgent``), so the global scheduler's boosts,
restores, trims and share shifts take the same path in simulation and in production.
A change the implementation will not make raises ``Refused`` with a code and a reason
(the agent's error codes, docs/agent.md); the scheduler then keeps its view of the
GPU as it was.

The checks (``check_setting``, ``check_shares``) are the agent's own: the agent runs
them on every online request, the simulated agent on every reaction of the scheduler.

A shared layer: it imports nothing of energyopt, so the online control, the simulator
and the agent (and a light client) can all import it.

Units: clocks in MHz, power limits in W, MPS shares in percent of the GPU's SMs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class Refused(Exception):
    """A change that will not be carried out: ``code`` (one of the agent's error codes,
    ``energyopt.agent.protocol.ERROR_CODES``) and a reason naming the GPU and the value."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason


class GpuControl(Protocol):
    """Changes of one GPU's settings within the envelope of the plan in force.

    ``gpu`` is the plan's GPU id. Each call is made or raises ``Refused`` (nothing
    changed); the return value is the implementation's record of the change."""

    def set_clock(self, gpu: str, clock_mhz: int) -> object:
        """Lock ``gpu``'s SM clock at ``clock_mhz`` (MHz)."""
        ...

    def set_power_limit(self, gpu: str, limit_w: float) -> object:
        """Set ``gpu``'s power limit to ``limit_w`` (W)."""
        ...

    def shift_shares(self, gpu: str, shares_pct: Mapping[str, int]) -> object:
        """Give the MPS clients of ``gpu`` named in ``shares_pct`` (a placement's
        ``workload`` or ``workload:phase``) these active-thread percentages; the others
        keep theirs. All or nothing."""
        ...


def check_range(
    where: str, what: str, value: float, bounds: tuple[float, float], unit: str, owner: str
) -> None:
    """Refused (outside_policy) when ``value`` lies outside the policy's ``bounds``
    (``what``: "clock" or "power limit"; ``owner``: "the policy's range")."""
    lo, hi = bounds
    if not lo <= value <= hi:
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        raise Refused(
            "outside_policy",
            f"{where}: {what} {shown} {unit} is outside {owner} {lo:g}-{hi:g} {unit}",
        )


def check_setting(
    where: str,
    name: str,
    value: float,
    *,
    policy: tuple[float, float],
    envelope: tuple[float, float],
    envelope_of: str,
    supported_clocks_mhz: Sequence[int] | None = None,
    device_range_w: tuple[float, float] | None = None,
) -> None:
    """The checks of one online change of ``name`` ("clock_mhz" or "power_limit_w") to
    ``value``, in the agent's order: the policy's range (outside_policy), what the device
    accepts (not_supported: ``supported_clocks_mhz``, ``device_range_w``; None: not
    checked), then the envelope of the plan in force (outside_envelope; ``envelope_of``
    names it, e.g. "plan quickstart@938ff222b49d")."""
    if name == "clock_mhz":
        check_range(where, "clock", int(value), policy, "MHz", "the policy's range")
        if supported_clocks_mhz is not None and int(value) not in supported_clocks_mhz:
            near = sorted(supported_clocks_mhz, key=lambda c: abs(c - value))[:2]
            raise Refused(
                "not_supported",
                f"{where}: {int(value)} MHz is not a supported SM clock (nearest: "
                f"{', '.join(map(str, sorted(near)))} MHz)",
            )
        unit = "MHz"
    elif name == "power_limit_w":
        check_range(where, "power limit", float(value), policy, "W", "the policy's range")
        if device_range_w is not None and not device_range_w[0] <= value <= device_range_w[1]:
            raise Refused(
                "not_supported",
                f"{where}: {value:g} W is outside the device's range "
                f"{device_range_w[0]:g}-{device_range_w[1]:g} W",
            )
        unit = "W"
    else:
        raise ValueError(f"unknown setting {name!r}")
    lo, hi = envelope
    if not lo <= value <= hi:
        raise Refused(
            "outside_envelope",
            f"{where}: {value:g} {unit} is outside the envelope of {envelope_of} "
            f"[{lo:g}, {hi:g}] {unit}",
        )


def check_shares(
    where: str, asked: Mapping[str, int], current: Mapping[str, int], capacity_pct: int = 100
) -> dict[str, int]:
    """The MPS layout of a GPU after a share shift: ``current`` {client: percent} with
    ``asked`` applied. Refused when ``asked`` is empty or names a client the GPU does not
    run (outside_envelope), a share is not a whole percent in 1-100 (bad_request), or the
    shift raises the GPU's total above ``capacity_pct`` (outside_envelope; a shift that
    does not raise the total is allowed, so a GPU whose draining instances still hold
    their shares can shift between the others)."""
    if not asked:
        raise Refused("bad_request", f"{where}: shares: no client named")
    unknown = sorted(set(asked) - set(current))
    if unknown:
        raise Refused(
            "outside_envelope",
            f"{where}: {', '.join(unknown)}: not an MPS client of the plan in force on this "
            f"GPU (clients: {', '.join(sorted(current)) or 'none'})",
        )
    for client, pct in asked.items():
        if isinstance(pct, bool) or not isinstance(pct, int) or not 1 <= pct <= 100:
            raise Refused(
                "bad_request", f"{where}: shares.{client}: expected a whole percent in 1-100"
            )
    after = {**current, **asked}
    total, before = sum(after.values()), sum(current.values())
    if total > capacity_pct and total > before:
        raise Refused(
            "outside_envelope",
            f"{where}: the shares would add up to {total} %, above {capacity_pct} % of the GPU",
        )
    return after
