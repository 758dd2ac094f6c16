"""The operator's policy file: which GPUs the agent may touch, the clock and power-limit
ranges it may set, and which peers (by uid and gid) may run which operation.

Example (YAML; JSON and TOML work too)::

    version: 1
    gpus: [0, 1, GPU-5f1c...]       # NVML indices or UUIDs, or "all"
    clock_mhz: {min: 900, max: 1980}
    power_limit_w: {min: 200, max: 700}
    allow:
      status: any                   # every peer that can open the socket
      heartbeat: {gids: [2001]}
      set_clock: {gids: [2001]}
      set_power_limit: {gids: [2001]}
      apply: {uids: [0], tls_clients: [controller]}
      restore: {uids: [0]}

An operation not listed under ``allow`` is refused to everyone. Units: MHz, W.
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from energyopt.agent.protocol import OPERATIONS, Refused
from energyopt.control import check_range
from energyopt.spec.base import Spec
from energyopt.spec.errors import SpecError
from energyopt.spec.io import parse, read_data

POLICY_VERSION = 1


class Range(Spec):
    """A closed range ``[min, max]``."""

    min: float = Field(ge=0)
    max: float = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.min > self.max:
            raise ValueError(f"min {self.min:g} is above max {self.max:g}")
        return self

    def holds(self, value: float) -> bool:
        """Whether ``value`` lies in the range."""
        return self.min <= value <= self.max


class Peers(Spec):
    """The peers an operation is open to: on the Unix socket any of ``uids`` or any member
    of ``gids``; on TCP a client whose certificate (signed by the agent's client CA)
    has one of ``tls_clients`` as its subject's common name."""

    uids: tuple[int, ...] = ()
    gids: tuple[int, ...] = ()
    tls_clients: tuple[str, ...] = ()


class Policy(Spec):
    """What the agent may do on this host, and for whom."""

    version: Literal[1]
    gpus: tuple[int | str, ...] | Literal["all"]
    clock_mhz: Range
    power_limit_w: Range
    allow: dict[str, Peers | Literal["any"]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_operations(self) -> Policy:
        unknown = sorted(set(self.allow) - set(OPERATIONS))
        if unknown:
            raise ValueError(
                f"allow: unknown operation(s) {', '.join(unknown)} "
                f"(operations: {', '.join(OPERATIONS)})"
            )
        return self

    def gpu_allowed(self, index: int, uuid: str) -> bool:
        """Whether the policy lets the agent touch the GPU with NVML ``index`` and ``uuid``."""
        if self.gpus == "all":
            return True
        return index in self.gpus or uuid in self.gpus

    def check_clock(self, where: str, clock_mhz: int) -> None:
        """Refused (outside_policy) when ``clock_mhz`` is outside the policy's range."""
        bounds = (self.clock_mhz.min, self.clock_mhz.max)
        check_range(where, "clock", clock_mhz, bounds, "MHz", "the policy's range")

    def check_power_limit(self, where: str, limit_w: float) -> None:
        """Refused (outside_policy) when ``limit_w`` is outside the policy's range."""
        bounds = (self.power_limit_w.min, self.power_limit_w.max)
        check_range(where, "power limit", float(limit_w), bounds, "W", "the policy's range")

    def authorize(self, op: str, peer: PeerCred) -> None:
        """Refused (unauthorized) unless the policy opens ``op`` to ``peer``."""
        rule = self.allow.get(op)
        if rule == "any":
            return
        if rule is not None and (
            (peer.uid is not None and peer.uid in rule.uids)
            or set(rule.gids) & set(peer.gids)
            or (peer.tls_name is not None and peer.tls_name in rule.tls_clients)
        ):
            return
        raise Refused(
            "unauthorized", f"{op}: not allowed for {peer.describe()} by the agent's policy"
        )


@dataclass(frozen=True)
class PeerCred:
    """Who is on the other end: on a Unix socket (SO_PEERCRED) the pid, the uid, and the
    primary gid followed by the supplementary groups of that uid's user (from the group
    database); on TCP the common name of the client certificate's subject."""

    pid: int | None
    uid: int | None
    gids: tuple[int, ...]
    tls_name: str | None = None

    def describe(self) -> str:
        """The peer, for messages."""
        if self.tls_name is not None:
            return f"TLS client {self.tls_name!r}"
        return f"uid {self.uid} (gids {', '.join(map(str, self.gids))})"


def peer_groups(uid: int, gid: int) -> tuple[int, ...]:
    """``gid`` and the supplementary groups of the user with ``uid`` (none when unknown)."""
    try:
        name = pwd.getpwuid(uid).pw_name
        extra = os.getgrouplist(name, gid)
    except (KeyError, OSError):
        extra = []
    return (gid, *sorted(set(extra) - {gid}))


def group_id(name_or_id: str) -> int:
    """A group given by name or number (for ``--socket-group``); SpecError if unknown."""
    if name_or_id.isdigit():
        return int(name_or_id)
    try:
        return grp.getgrnam(name_or_id).gr_gid
    except KeyError:
        raise SpecError([f"--socket-group: no group named {name_or_id!r}"]) from None


def load_policy(path: str | Path) -> Policy:
    """Read and check a policy file; SpecError naming the file and each field."""
    data = read_data(path)
    if data.get("version") != POLICY_VERSION:
        raise SpecError(
            [f"{path}: version: expected {POLICY_VERSION} (the policy format version), "
             f"got {data.get('version')!r}"]
        )
    return parse(Policy, data, str(path))
