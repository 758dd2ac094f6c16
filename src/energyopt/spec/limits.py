"""Size limits: how much work one input file may ask for (docs/limits.md).

A file can ask for more than any machine can do (``count: 4611686018427387904``
GPUs, a compile grid of millions of cells, a load scale of a trillion). Such
files are refused while they are validated, with a message that names the
field, the limit, and the flag that raises it: ``--limit NAME=VALUE`` on every
command. The defaults are above the bundled instances (the largest is
fleet-10240: 10,240 GPUs, 1,024 workloads, 10.5 M workload-GPU pairs, which loads
in seconds and solves in under 1 GB), so every bundled file loads without a flag.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields, replace

from energyopt.spec.errors import SpecError


@dataclass(frozen=True)
class Limits:
    """Largest sizes a file may ask for; each is raised with ``--limit NAME=VALUE``."""

    gpus: int = 65_536
    """GPUs in one cluster (serving instance, co-location pools, task graph)."""
    workloads: int = 2_048
    """Workloads of one serving instance."""
    workload_gpus: int = 33_554_432
    """Workloads x GPUs of one serving instance (size of the placement decisions)."""
    compile_cells: int = 100_000
    """Cells of a plan compile spec (SLO tiers x GPU types x load scales x ...)."""
    load_points: int = 10_000
    """Load grid points of an operating-point compile spec."""
    load_scale: float = 1_000.0
    """Load scale of an evaluation spec (multiple of the base instance's rates)."""
    tasks: int = 1_000_000
    """Tasks of one task graph."""
    keepalive_cells: int = 10_000_000
    """Functions x states (3 per node) x windows of one keep-alive file (the size of
    its per-window state arrays)."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Names accepted by ``--limit``."""
        return tuple(f.name for f in fields(cls))


_CURRENT: ContextVar[Limits] = ContextVar("energyopt_limits", default=Limits())  # noqa: B039


def limits() -> Limits:
    """The limits in force (defaults unless raised with ``--limit`` or ``using``)."""
    return _CURRENT.get()


@contextmanager
def using(new: Limits) -> Iterator[None]:
    """Validate with ``new`` limits inside the ``with`` block."""
    token = _CURRENT.set(new)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def set_limits(new: Limits) -> None:
    """Put ``new`` limits in force for the rest of this process (the CLI's ``--limit``)."""
    _CURRENT.set(new)


def parse_limit_options(options: list[str], base: Limits | None = None) -> Limits:
    """``base`` (default: the limits in force) with ``NAME=VALUE`` options applied."""
    out = base or limits()
    for text in options:
        name, sep, value = text.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in Limits.names():
            known = ", ".join(Limits.names())
            raise SpecError([f"--limit {text!r}: expected NAME=VALUE with NAME one of {known}"])
        try:
            number: float = float(value)
            if isinstance(getattr(out, name), int):
                number = int(number)
        except (ValueError, OverflowError):
            raise SpecError([f"--limit {text!r}: {value!r} is not a number"]) from None
        if not number > 0 or number == float("inf"):
            raise SpecError([f"--limit {text!r}: must be a positive finite number"])
        out = replace(out, **{name: number})  # type: ignore[arg-type]
    return out


def over_limit(what: str, value: float, name: str) -> str | None:
    """A message if ``value`` exceeds limit ``name``, else None."""
    limit = getattr(limits(), name)
    if value <= limit:
        return None
    return (
        f"{what} is {value:,g}, above the limit of {limit:,g} "
        f"(raise it with --limit {name}=N if you mean it; docs/limits.md)"
    )
