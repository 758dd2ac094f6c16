"""What the agent keeps on disk in its state directory, so that a restart finds it.

::

    STATE_DIR/agent-state.json   the plan in force (with its device map and envelope),
                                 and, while an apply or a restore runs, that it does
    STATE_DIR/checkpoints/       the executor's checkpoints (docs/executor.md), chained:
                                 the newest leads back to the GPUs before the first apply
    STATE_DIR/restored/          checkpoints moved aside after a restore

Every write is atomic (a reader sees the old file or the new one, never a part).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from energyopt.spec.errors import SpecError
from energyopt.spec.io import read_data, write_text_atomic

STATE_VERSION = 1
STATE_FILE = "agent-state.json"


@dataclass
class PlanInForce:
    """A plan the agent applied: the plan file's data, its id, the device of each plan GPU
    (UUID, so a restart finds the GPU even if indices moved), and each GPU's envelope
    (``{"clock_mhz": [lo, hi], "power_limit_w": [lo, hi]}``, MHz and W)."""

    plan: dict[str, Any]
    plan_id: str
    devices: dict[str, str]
    envelope: dict[str, dict[str, list[float]]]
    mps_dir: str
    """The base of the per-GPU MPS directories the plan was applied with (a restart with
    another ``--mps-dir`` still finds the daemons it started)."""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "plan": self.plan,
            "plan_id": self.plan_id,
            "devices": self.devices,
            "envelope": self.envelope,
            "mps_dir": self.mps_dir,
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> PlanInForce:
        """Parse what ``to_json`` wrote; SpecError naming ``where`` and the field."""
        if not isinstance(data, dict):
            raise SpecError([f"{where}: expected an object"])
        fields = (
            ("plan", dict),
            ("plan_id", str),
            ("devices", dict),
            ("envelope", dict),
            ("mps_dir", str),
        )
        for name, kind in fields:
            if not isinstance(data.get(name), kind):
                raise SpecError([f"{where}.{name}: missing or not a {kind.__name__}"])
        return cls(*(data[name] for name, _ in fields))


@dataclass
class AgentState:
    """The plan in force, the apply in flight (its checkpoint and the plan it applies),
    and whether a restore was in flight."""

    in_force: PlanInForce | None = None
    applying: PlanInForce | None = None
    applying_checkpoint: str | None = None
    restoring: bool = False


class StateDir:
    """The agent's state directory (created with mode 0700 if missing)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.checkpoints = self.root / "checkpoints"
        self.restored = self.root / "restored"
        self.file = self.root / STATE_FILE

    def create(self) -> None:
        """Make the folders (private to the agent's user)."""
        for folder in (self.root, self.checkpoints, self.restored):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)

    def load(self) -> AgentState:
        """The saved state; an empty one when none was saved; SpecError if it is damaged."""
        if not self.file.exists():
            return AgentState()
        data = read_data(self.file, "json")
        where = str(self.file)
        if data.get("version") != STATE_VERSION:
            raise SpecError([f"{where}: version: expected {STATE_VERSION}"])
        state = AgentState()
        if data.get("in_force") is not None:
            state.in_force = PlanInForce.from_json(data["in_force"], f"{where}: in_force")
        if data.get("applying") is not None:
            state.applying = PlanInForce.from_json(data["applying"], f"{where}: applying")
            ckpt = data.get("applying_checkpoint")
            if not isinstance(ckpt, str):
                raise SpecError([f"{where}: applying_checkpoint: missing or not a string"])
            state.applying_checkpoint = ckpt
        restoring = data.get("restoring", False)
        if not isinstance(restoring, bool):
            raise SpecError([f"{where}: restoring: expected true or false"])
        state.restoring = restoring
        return state

    def save(self, state: AgentState) -> None:
        """Write ``state`` atomically (and synced to disk before this returns)."""
        data = {
            "version": STATE_VERSION,
            "in_force": state.in_force.to_json() if state.in_force else None,
            "applying": state.applying.to_json() if state.applying else None,
            "applying_checkpoint": state.applying_checkpoint,
            "restoring": state.restoring,
        }
        write_text_atomic(self.file, json.dumps(data, indent=1) + "\n")

    def new_checkpoint(self, what: str) -> Path:
        """A fresh checkpoint path in the checkpoint folder (never an existing file)."""
        stamp = time.time_ns()
        path = self.checkpoints / f"{what}-{stamp}.json"
        while path.exists():
            stamp += 1
            path = self.checkpoints / f"{what}-{stamp}.json"
        return path

    def retire_checkpoints(self) -> list[Path]:
        """Move every checkpoint to ``restored/`` (after a restore put the originals back),
        so that a later apply does not chain to them. Returns the new paths."""
        moved = []
        for path in sorted(self.checkpoints.glob("*.json")):
            target = self.restored / path.name
            os.replace(path, target)
            moved.append(target)
        return moved

