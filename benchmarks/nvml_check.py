"""Real-GPU check of the executor on one GPU (needs an NVIDIA GPU, nvidia-ml-py and root).

Usage: python benchmarks/nvml_check.py [--gpu 0] [--seconds 20] [--no-mig]

One prepared run, well under 8 minutes, in four steps on NVML device ``--gpu``:

1. status: the readings ``energyopt status`` prints;
2. clocks and power limit: lock the SM clock at a supported clock near the middle
   of the range and set the power limit halfway between the device's limits
   (persistence mode on), through the executor's transaction (checkpoint, apply,
   read back), then ``restore`` the checkpoint;
3. MIG, where the GPU supports it: enable MIG with a 3g + 2g + 1g layout at the
   placements the planner chooses, read the instances back with their start
   memory slices, then restore (MIG mode and any earlier layout as they were);
4. energy: the NVML energy counter over ``--seconds`` idle and ``--seconds``
   under a bf16 matmul load (PyTorch or CuPy, if installed), clock unlocked.

It prints one table row per setting: the value before, the target, the value
read back after the apply, the value after the restore, and whether each matched.
Exit status: 0 all matched, 1 a mismatch or an executor error, 2 no GPU or no
nvidia-ml-py here. Ctrl-C during an apply rolls back like ``energyopt apply``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from energyopt.catalog import builtin_catalog, mig
from energyopt.nvml.actions import (
    Action,
    ConfigureMig,
    Ctx,
    LockClocks,
    SetPersistence,
    SetPowerLimit,
)
from energyopt.nvml.errors import ExecutorError
from energyopt.nvml.gpucheck import _load
from energyopt.nvml.measure import format_status, gpu_status, measure
from energyopt.nvml.mps import SubprocessMps
from energyopt.nvml.names import name_matches
from energyopt.nvml.session import RealClock
from energyopt.nvml.transaction import Transaction, restore

BUDGET_S = 480.0
"""The whole check stays within 8 minutes (the energy windows are cut to fit)."""


@dataclass
class Row:
    """One setting: before, target, read back after the apply, after the restore (text)."""

    step: str
    setting: str
    before: str
    target: str
    read_back: str
    restored: str
    ok: bool


def apply_and_restore(ctx: Ctx, step: str, actions: list[Action], folder: Path) -> list[Row]:
    """Apply ``actions`` in one transaction, read each back, restore, read again."""
    before = [a.read(ctx) for a in actions]
    checkpoint = folder / f"{step}.json"
    try:
        Transaction(ctx, actions, checkpoint).run()
        after = [a.read(ctx) for a in actions]
    finally:
        errors = restore(ctx, checkpoint)[1] if checkpoint.exists() else []
    restored = [a.read(ctx) for a in actions]
    rows = []
    for a, b, got, back in zip(actions, before, after, restored, strict=True):
        ok = a.is_noop(got) and (back == b or (b == "unknown" and back in (None, "unknown")))
        rows.append(
            Row(step, a.describe(), a.show(b), a.show(a.target()), a.show(got), a.show(back), ok)
        )
    for line in errors:
        rows.append(Row(step, "restore", "", "", "", line, False))
    return rows


def mig_layout(gtype: Any) -> tuple[list[str], list[int]] | None:
    """A 3g + 2g + 1g layout of this GPU type with its placements (None without MIG data)."""
    by_slices: dict[int, str] = {}
    for p in gtype.mig_profiles:
        if not p.media_extensions and p.compute_slices in (1, 2, 3):
            by_slices.setdefault(p.compute_slices, p.name)
    if sorted(by_slices) != [1, 2, 3]:
        return None
    placed = mig.place(gtype, [by_slices[3], by_slices[2], by_slices[1]])
    if placed is None:
        return None
    return [n for n, _ in placed], [s for _, s in placed]


def energy_rows(nvml: Any, index: int, seconds: float) -> list[Row]:
    """Energy counter over an idle window and a loaded one (W and J in the table)."""
    rows = []
    work, load_name = _load(index)
    for label, loaded in (("idle", False), (f"load: {load_name}", True)):
        if loaded and work is None:
            break
        stop = threading.Event()
        thread = threading.Thread(target=work, args=(stop,), daemon=True) if loaded else None
        try:
            if thread:
                thread.start()
                RealClock().sleep(min(3.0, seconds))
            windows, _ = measure(nvml, RealClock(), seconds=seconds, interval_s=0.2)
        finally:
            stop.set()
            if thread:
                thread.join()
        w = windows[index]
        text = f"{w.energy_j:,.1f} J in {w.seconds:.1f} s = {w.avg_power_w:.1f} W"
        ok = w.energy_j > 0 and abs(w.avg_power_w - w.mean_sampled_power_w) <= max(
            0.25 * w.mean_sampled_power_w, 5.0
        )
        rows.append(
            Row(
                "energy",
                label,
                "",
                "",
                text,
                f"sampled {w.mean_sampled_power_w:.1f} W, {w.mean_sm_clock_mhz:.0f} MHz",
                ok,
            )
        )
    return rows


def print_table(rows: list[Row]) -> None:
    """The rows as an aligned table."""
    head = ("step", "setting", "before", "target", "read back", "after restore", "ok")
    cells = [head] + [
        (r.step, r.setting, r.before, r.target, r.read_back, r.restored, "yes" if r.ok else "NO")
        for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())


def run_check(nvml: Any, index: int, seconds: float, with_mig: bool) -> int:
    """The four steps on an open backend; the exit status."""
    start = time.monotonic()
    rows: list[Row] = []
    print("\n".join(format_status([gpu_status(nvml, index)])))
    name, uuid = nvml.name(index), nvml.uuid(index)
    gtype = next((g for g in builtin_catalog().gpus.values() if name_matches(g.name, name)), None)
    ctx = Ctx(nvml, SubprocessMps())
    clocks = nvml.supported_sm_clocks(index)
    clock = clocks[len(clocks) // 2]
    lo, hi = nvml.get_power_limit_constraints(index)
    limit = (lo + hi) // 2 // 1000 * 1000
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        settings: list[Action] = [
            SetPersistence("check", index, uuid, enabled=True),
            LockClocks("check", index, uuid, clock_mhz=clock),
            SetPowerLimit("check", index, uuid, limit_mw=limit),
        ]
        rows += apply_and_restore(ctx, "clocks", settings, folder)
        layout = mig_layout(gtype) if gtype is not None else None
        if with_mig and nvml.mig_supported(index) and layout is not None:
            names, starts = layout
            action = ConfigureMig(
                "check", index, uuid, enabled=True, instances=tuple(names), placements=tuple(starts)
            )
            try:
                rows += apply_and_restore(ctx, "mig", [action], folder)
            except ExecutorError as exc:  # e.g. the mode change needs a reset here
                rows.append(Row("mig", action.describe(), "", "", "", str(exc), False))
        else:
            why = "not supported" if not nvml.mig_supported(index) else "skipped"
            rows.append(Row("mig", f"MIG {why}", "", "", "", "", True))
    left = BUDGET_S - (time.monotonic() - start) - 10.0
    rows += energy_rows(nvml, index, max(1.0, min(seconds, left / 2 - 3.0)))
    print()
    print_table(rows)
    bad = [r for r in rows if not r.ok]
    print(
        f"\n{len(rows) - len(bad)} of {len(rows)} rows matched in {time.monotonic() - start:.0f} s"
    )
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check on the real backend; 2 where there is no GPU or no nvidia-ml-py."""
    ap = argparse.ArgumentParser(prog="nvml_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", type=int, default=0, help="NVML index")
    ap.add_argument("--seconds", type=float, default=20.0, help="each energy window (s)")
    ap.add_argument("--no-mig", action="store_true", help="leave MIG alone")
    args = ap.parse_args(argv)
    try:
        from energyopt.nvml.real import NvmlBackend

        nvml = NvmlBackend()
        nvml.open()
    except ExecutorError as exc:
        print(f"nvml_check: cannot run here: {exc}", file=sys.stderr)
        return 2
    try:
        return run_check(nvml, args.gpu, args.seconds, not args.no_mig)
    except ExecutorError as exc:
        print(f"nvml_check: {exc}", file=sys.stderr)
        return 1
    finally:
        nvml.close()


if __name__ == "__main__":
    raise SystemExit(main())
