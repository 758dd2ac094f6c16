"""Write a family's mathematical program as MPS or LP, for other solvers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import highspy

from energyopt.backends.highs import quiet_highs
from energyopt.spec.errors import SpecError


def write_program(program: Any, path: str | Path, fmt: str) -> None:
    """Write ``program`` (a Pyomo model or a HiGHS ``HighsLp``) to ``path`` as ``fmt``
    (``mps`` or ``lp``). Written to a temporary name first, then renamed."""
    target = Path(path)
    tmp = target.with_name(f".{target.stem}.tmp.{fmt}")
    try:
        if isinstance(program, highspy.HighsLp):
            h = quiet_highs()
            h.passModel(program)
            status = h.writeModel(str(tmp))
            if status == highspy.HighsStatus.kError:
                raise SpecError([f"{path}: HiGHS could not write the model"])
        else:
            program.write(str(tmp), format=fmt, io_options={"symbolic_solver_labels": True})
        tmp.replace(target)
    except OSError as exc:
        raise SpecError([f"{path}: cannot write: {exc.strerror or exc}"]) from None
    finally:
        if tmp.exists():
            tmp.unlink()
