"""Apply actions all-or-nothing: checkpoint, apply, read back, and roll back on failure.

Order: read every original value; write the checkpoint file (before any write);
apply each action that is not already in place and read it back; on any error,
SIGINT or SIGTERM, undo every started action in reverse order and raise
``ApplyFailed`` (``ApplyInterrupted`` for signals). Signals arriving during the
rollback are held until it is done.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any

from energyopt.nvml.actions import Action, Ctx, action_from_json
from energyopt.nvml.errors import (
    ApplyFailed,
    ApplyInterrupted,
    CheckpointError,
    ExecutorError,
    Interrupted,
)

CHECKPOINT_VERSION = 1


@dataclass
class ApplyReport:
    """What an apply did."""

    applied: list[Action]
    skipped: list[Action]
    checkpoint: Path | None


def write_checkpoint(path: Path, actions: list[Action], originals: list[Any], kind: str) -> None:
    """Write the checkpoint atomically; refuse to overwrite one (it may hold older originals)."""
    if path.exists():
        raise CheckpointError(
            f"{path} exists: it may hold the originals of an earlier apply; restore from it "
            "first (`energyopt restore`) or pass another --checkpoint path"
        )
    data = {
        "version": CHECKPOINT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "backend": kind,
        "entries": [
            {"action": a.to_json(), "original": o} for a, o in zip(actions, originals, strict=True)
        ],
    }
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError as exc:
        raise CheckpointError(
            f"cannot write checkpoint {path}: {exc}; nothing was changed"
        ) from None


def read_checkpoint(path: str | Path) -> list[tuple[Action, Any]]:
    """The (action, original value) pairs of a checkpoint file."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path}: not an energyopt checkpoint (version {CHECKPOINT_VERSION})")
    return [(action_from_json(e["action"]), e["original"]) for e in data.get("entries", [])]


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``Interrupted`` (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _signals_held() -> Iterator[list[int]]:
    """Record SIGINT/SIGTERM instead of acting on them (during a rollback)."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        held.append(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield held
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def rollback(ctx: Ctx, pairs: list[tuple[Action, Any]]) -> list[str]:
    """Undo ``pairs`` in reverse order; the errors that remain (empty: all restored)."""
    errors: list[str] = []
    with _signals_held():
        for action, original in reversed(pairs):
            try:
                action.undo(ctx, original)
                action_read = action.read(ctx)
                if action_read != original and original != "unknown":
                    errors.append(
                        f"{action.where()}: {action.describe()}: still "
                        f"{action.show(action_read)}, was {action.show(original)}"
                    )
            except Exception as exc:  # keep restoring the others
                errors.append(f"{action.where()}: restoring {action.kind}: {exc}")
    return errors


class Transaction:
    """Runs ``actions`` on ``ctx`` all-or-nothing, checkpointing to ``checkpoint``."""

    def __init__(
        self,
        ctx: Ctx,
        actions: list[Action],
        checkpoint: str | Path,
        say: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.ctx = ctx
        self.actions = actions
        self.checkpoint = Path(checkpoint)
        self.say = say

    def run(self) -> ApplyReport:
        """Apply; on failure everything started is rolled back and ApplyFailed raised."""
        originals = [a.read(self.ctx) for a in self.actions]
        todo = [(a, o) for a, o in zip(self.actions, originals, strict=True) if not a.is_noop(o)]
        skipped = [a for a, o in zip(self.actions, originals, strict=True) if a.is_noop(o)]
        if not todo:
            return ApplyReport([], skipped, None)
        write_checkpoint(self.checkpoint, self.actions, originals, self.ctx.nvml.kind)
        started: list[tuple[Action, Any]] = []
        try:
            with _signals_raise():
                for action, original in todo:
                    started.append((action, original))
                    self.say(f"{action.where()}: {action.describe()}")
                    action.apply(self.ctx)
                    action.verify(self.ctx)
        except (Exception, KeyboardInterrupt, Interrupted) as exc:
            errors = rollback(self.ctx, started)
            cls = (
                ApplyInterrupted
                if isinstance(exc, KeyboardInterrupt | Interrupted)
                else ApplyFailed
            )
            raise cls(exc, errors) from exc
        return ApplyReport([a for a, _ in started], skipped, self.checkpoint)


def restore(ctx: Ctx, path: str | Path) -> tuple[int, list[str]]:
    """Put back every original of a checkpoint (devices found by UUID).

    Returns (number of settings checked, errors). Settings already at their
    original value are not written.
    """
    pairs = []
    for action, original in read_checkpoint(path):
        try:
            index = ctx.nvml.index_of_uuid(action.uuid)
        except ExecutorError as exc:
            raise CheckpointError(f"{path}: {exc}") from None
        pairs.append((replace(action, index=index), original))
    return len(pairs), rollback(ctx, pairs)
