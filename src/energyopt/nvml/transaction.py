"""Apply actions all-or-nothing: checkpoint, apply, read back, and roll back on failure.

Order: read every original value; write the checkpoint file (before any write),
chained to earlier checkpoints in its folder so that the newest one always leads
back to the state before the first apply;
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

from energyopt.nvml.actions import (
    Action,
    Ctx,
    action_from_json,
    describe_json,
    original_from_json,
)
from energyopt.nvml.errors import (
    ApplyFailed,
    ApplyInterrupted,
    BadCheckpoint,
    CheckpointError,
    ExecutorError,
    Interrupted,
)
from energyopt.spec.errors import SpecError
from energyopt.spec.io import read_data

CHECKPOINT_VERSION = 1
BACKENDS = ("nvml", "sim")
"""``backend`` of a checkpoint: the kind of the backend that wrote it."""


@dataclass
class ApplyReport:
    """What an apply did."""

    applied: list[Action]
    skipped: list[Action]
    checkpoint: Path | None


def write_checkpoint(
    path: Path,
    actions: list[Action],
    originals: list[Any],
    kind: str,
    chained_from: list[str] | None = None,
) -> None:
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
        "chained_from": chained_from or [],
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


def _parse_checkpoint(path: str | Path) -> tuple[dict[str, Any], list[tuple[Action, Any]]]:
    """The checkpoint's header and (action, original) pairs; BadCheckpoint names the file
    and the field."""
    try:
        return _read_checkpoint_file(path)
    except BadCheckpoint:
        raise
    except CheckpointError as exc:
        raise BadCheckpoint(str(exc)) from None


def _read_checkpoint_file(path: str | Path) -> tuple[dict[str, Any], list[tuple[Action, Any]]]:
    try:
        # JSON whatever the suffix, with the file readers' checks and limits (a FIFO or
        # device, a file over 64 MiB, nesting deeper than spec.io.MAX_NESTING)
        data = read_data(path, "json")
    except SpecError as exc:
        raise CheckpointError("; ".join(exc.problems)) from None
    if data.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path}: not an energyopt checkpoint (version {CHECKPOINT_VERSION})")
    backend = data.get("backend")
    if backend not in BACKENDS:
        raise CheckpointError(
            f"{path}: backend: expected one of {', '.join(BACKENDS)}, got "
            f"{describe_json(backend) if not isinstance(backend, str) else repr(backend)}"
        )
    chained = data.get("chained_from", [])
    if not isinstance(chained, list):
        raise CheckpointError(
            f"{path}: chained_from: expected a list of checkpoint files, got "
            f"{describe_json(chained)}"
        )
    for i, item in enumerate(chained):
        if not isinstance(item, str) or not item:
            raise CheckpointError(
                f"{path}: chained_from[{i}]: expected a checkpoint file name, got "
                f"{describe_json(item) if item != '' else 'an empty string'}"
            )
    if "entries" not in data:
        raise CheckpointError(f"{path}: entries: missing")
    entries = data["entries"]
    if not isinstance(entries, list):
        raise CheckpointError(
            f"{path}: entries: expected a list of settings, got {describe_json(entries)}"
        )
    pairs: list[tuple[Action, Any]] = []
    for i, entry in enumerate(entries):
        where = f"{path}: entries[{i}]"
        if not isinstance(entry, dict):
            raise CheckpointError(f"{where}: expected an object with action and original")
        for key in ("action", "original"):
            if key not in entry:
                raise CheckpointError(f"{where}.{key}: missing")
        action = action_from_json(entry["action"], f"{where}.action")
        original = original_from_json(action.kind, entry["original"], f"{where}.original")
        pairs.append((action, original))
    return data, pairs


def read_checkpoint(path: str | Path) -> list[tuple[Action, Any]]:
    """The (action, original value) pairs of a checkpoint file."""
    return _parse_checkpoint(path)[1]


def _setting(action: Action) -> tuple[str, ...]:
    """What a checkpoint entry is about: the GPU, the kind of setting, the MPS pipe."""
    pipe = getattr(action, "pipe_dir", "")
    return (action.uuid, action.kind, str(pipe))


def earlier_checkpoints(folder: Path, kind: str) -> list[tuple[Path, list[tuple[Action, Any]]]]:
    """Readable checkpoints of backend ``kind`` in ``folder``, newest first (others skipped)."""
    found: list[tuple[str, int, Path, list[tuple[Action, Any]]]] = []
    if not folder.is_dir():
        return []
    for path in folder.glob("*.json"):
        try:
            data, pairs = _parse_checkpoint(path)
            stamp = path.stat().st_mtime_ns
        except (CheckpointError, OSError):
            continue
        if data.get("backend") == kind:
            found.append((str(data.get("created", "")), stamp, path, pairs))
    found.sort(key=lambda f: (f[0], f[1]), reverse=True)
    return [(path, pairs) for _, _, path, pairs in found]


def chain_originals(
    ctx: Ctx, actions: list[Action], current: list[Any], folder: Path
) -> tuple[list[Action], list[Any], list[str]]:
    """The entries of a new checkpoint that lead back to the state before the first apply.

    A setting that an earlier checkpoint (in ``folder``) changed and that still
    holds that apply's target keeps the earlier original instead of the current
    value; settings of earlier checkpoints that this apply does not touch, and
    that still hold their target, are carried over. Returns the actions, their
    originals and the checkpoints used.
    """
    earlier: dict[tuple[str, ...], tuple[Action, Any]] = {}
    used: list[str] = []
    for path, pairs in earlier_checkpoints(folder, ctx.nvml.kind):
        fresh = {_setting(a): (a, o) for a, o in pairs if _setting(a) not in earlier}
        if fresh:
            earlier.update(fresh)
            used.append(str(path))
    out_actions = list(actions)
    out_originals = list(current)
    chained: set[str] = set()
    for i, (action, value) in enumerate(zip(actions, current, strict=True)):
        prev = earlier.pop(_setting(action), None)
        if prev is not None and prev[0].is_noop(value):
            out_originals[i] = prev[1]
            chained.add(_setting(action)[0])
    for prev_action, prev_original in earlier.values():
        try:
            index = ctx.nvml.index_of_uuid(prev_action.uuid)
            moved = replace(prev_action, index=index)
            if not moved.is_noop(moved.read(ctx)):
                continue
        except ExecutorError:
            continue
        out_actions.append(moved)
        out_originals.append(prev_original)
        chained.add(prev_action.uuid)
    return out_actions, out_originals, used if chained else []


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


def rollback(ctx: Ctx, pairs: list[tuple[Action, Any]], changed_only: bool = False) -> list[str]:
    """Undo ``pairs`` in reverse order; the settings that still differ (empty: all restored).

    With ``changed_only`` (a rollback in the process that applied) a setting that
    reads as its original is not written at all. A setting is reported only when
    it really differs from its original after the undo (or cannot be read).
    """
    errors: list[str] = []
    with _signals_held():
        for action, original in reversed(pairs):
            failure = ""
            try:
                if not (changed_only and action.read(ctx) == original):
                    action.undo(ctx, original)
            except Exception as exc:  # keep restoring the others
                failure = f"{action.where()}: restoring {action.kind}: {exc}"
            try:
                now = action.read(ctx)
            except Exception as exc:
                errors.append(failure or f"{action.where()}: cannot read {action.kind}: {exc}")
                continue
            if action.is_original(now, original):
                continue
            errors.append(
                failure
                or f"{action.where()}: {action.describe()}: still {action.show(now)}, "
                f"was {action.show(original)}"
            )
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
        entries, recorded, chained = chain_originals(
            self.ctx, self.actions, originals, self.checkpoint.parent
        )
        write_checkpoint(self.checkpoint, entries, recorded, self.ctx.nvml.kind, chained)
        started: list[tuple[Action, Any]] = []
        try:
            with _signals_raise():
                for action, original in todo:
                    started.append((action, original))
                    self.say(f"{action.where()}: {action.describe()}")
                    action.apply(self.ctx)
                    action.verify(self.ctx)
        except (Exception, KeyboardInterrupt, Interrupted) as exc:
            errors = rollback(self.ctx, started, changed_only=True)
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
    data, checked = _parse_checkpoint(path)
    if data["backend"] != ctx.nvml.kind:
        raise CheckpointError(
            f"{path}: backend: written by the {data['backend']} backend; this is the "
            f"{ctx.nvml.kind} backend, whose GPUs it says nothing about"
        )
    pairs = []
    for action, original in checked:
        try:
            index = ctx.nvml.index_of_uuid(action.uuid)
        except ExecutorError as exc:
            raise CheckpointError(f"{path}: {exc}") from None
        pairs.append((replace(action, index=index), original))
    return len(pairs), rollback(ctx, pairs)
