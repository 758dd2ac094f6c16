"""Write a family's mathematical program as MPS or LP, for other solvers."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import highspy

from energyopt.backends.highs import quiet_highs
from energyopt.spec.errors import SpecError
from energyopt.spec.io import write_bytes_atomic

LAST_LINE = {"mps": "ENDATA", "lp": "END"}
"""The line that ends a whole file of each format (HiGHS and Pyomo both write it)."""


def write_program(program: Any, path: str | Path, fmt: str) -> None:
    """Write ``program`` (a Pyomo model or a HiGHS ``HighsLp``) to ``path`` as ``fmt``
    (``mps`` or ``lp``); SpecError naming ``path`` if it cannot be written whole.

    The writer (HiGHS or Pyomo) writes into a private folder under a name with the
    format's suffix; the text is checked to end as a whole file does (HiGHS does not
    report a failed write: on a full disk it left a truncated file and exit 0) and then
    written next to ``path`` and renamed over it, so ``path`` holds the old file or the
    whole new one."""
    target = Path(path)
    with tempfile.TemporaryDirectory(prefix="energyopt-export-") as folder:
        tmp = Path(folder) / f"model.{fmt}"
        try:
            if isinstance(program, highspy.HighsLp):
                h = quiet_highs()
                h.passModel(program)
                status = h.writeModel(str(tmp))
                if status == highspy.HighsStatus.kError:
                    raise SpecError([f"{path}: HiGHS could not write the model"])
            else:
                # the format follows the suffix (Pyomo warned when told "lp" for a .lp name)
                program.write(str(tmp), io_options={"symbolic_solver_labels": True})
            payload = tmp.read_bytes()
        except OSError as exc:
            raise SpecError([f"{path}: cannot write: {exc.strerror or exc}"]) from None
    if not ends_whole(payload, fmt):
        raise SpecError(
            [
                f"{path}: cannot write: the {fmt.upper()} writer stopped before the end of the "
                "model (is the temporary folder's disk full?); nothing was written"
            ]
        )
    write_bytes_atomic(target, payload)


def ends_whole(payload: bytes, fmt: str) -> bool:
    """Whether ``payload`` ends with the line that closes a whole ``fmt`` file."""
    lines = payload.rstrip().splitlines()
    return bool(lines) and lines[-1].strip().upper() == LAST_LINE[fmt].encode()
