"""The table lookups the online schedulers make, over an operating-point table.

An operating-point table (``energyopt compile`` of kind ``oppoints``,
docs/tables.md) is the offline profile a deployment ships next to its plans. The
online schedulers read five of its columns and one small derived table, each
through a precompiled scalar getter (``Table.getter`` / ``Table.row_getter``:
a few dict subscripts, no numpy), and count every call:

* ``capacity_rps(label, type, clock, share)``: the slice's SLO capacity (req/s);
* ``slice_power_w(label, type, clock, share, rate)``: the dynamic power (W) of an
  open slice of that op at ``rate`` req/s: its fixed part from the moment the
  slice is opened, whatever its rate, plus its marginal part per request/s
  (``fixed_w`` + ``marginal_w_per_rps`` x rate, one row lookup);
* ``raise_to(label, type, clock, share_used, load)``: the lowest clock at or
  above ``clock`` at which a slice fitting next to ``share_used`` covers
  ``load`` req/s, and that slice's share (``raise_clock_mhz``, ``raise_share``);
* ``on_power_w(type, clock)``: the GPU's static on-power at a locked clock (W),
  tabulated here from ``perf/power.py`` for every candidate clock of the types.

``LookupCounter`` is the budget meter: every getter above adds one to it.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from energyopt.catalog.problem import Problem
from energyopt.perf.oppoints import candidate_clocks, share_capacity, share_options
from energyopt.perf.power import gpu_on_power_w
from energyopt.tables.format import Table, TableError, write_table
from energyopt.tables.oppoints import VERSION, build_oppoint_columns


@dataclass
class LookupCounter:
    """Table lookups made so far (one per getter call)."""

    count: int = 0


class OpLookups:
    """Counted scalar lookups in an operating-point table (see module docs)."""

    def __init__(self, table: Table, problem: Problem) -> None:
        if table.kind != "oppoints":
            raise TableError(table.path, f"a {table.kind} table, not an oppoints table")
        version = table.meta.get("oppoints_version", 1)
        if version != VERSION:
            raise TableError(
                table.path,
                f"an oppoints table of version {version} (this energyopt reads version "
                f"{VERSION}: a slice's power as fixed_w plus marginal_w_per_rps per "
                "request/s); compile it again with energyopt compile",
            )
        if "slo_tier" in table.axes:
            raise TableError(table.path, "tables with SLO tiers are not supported online")
        labels = set(table.axes["workload"].values)
        missing = [w.name for w in problem.instance.workloads if w.name not in labels]
        if missing:
            raise TableError(table.path, f"no rows for workloads {missing}")
        self.table = table
        self.counter = LookupCounter()
        op = ("workload", "gpu_type", "clock_mhz", "share")
        self._cap = table.getter("capacity_rps", *op)
        _, self._line = table.row_getter(*op, columns=("fixed_w", "marginal_w_per_rps"))
        _, self._raise = table.row_getter(
            "workload",
            "gpu_type",
            "clock_mhz",
            "share_used",
            "load",
            columns=("raise_clock_mhz", "raise_share"),
        )
        self.load_top_rps = float(table.meta.get("load_max_rps", 0.0))
        self.clocks: dict[str, tuple[int, ...]] = {}
        self.shares: dict[str, tuple[int, ...]] = {}
        self.share_capacity: dict[str, int] = {
            str(k): int(v) for k, v in table.meta.get("share_capacity", {}).items()
        }
        self._on_power: dict[tuple[str, int], float] = {}
        for name in problem.gpu_types_used():
            gpu = problem.gpu_type(name)
            self.clocks[name] = candidate_clocks(problem, gpu)
            self.shares[name] = tuple(sorted({s[0] for s in share_options(problem, gpu)}))
            self.share_capacity.setdefault(name, share_capacity(problem, gpu))
            for clock in self.clocks[name]:
                self._on_power[(name, clock)] = gpu_on_power_w(gpu, clock)

    @classmethod
    def build(cls, problem: Problem, directory: str | Path | None = None) -> OpLookups:
        """Compile the operating-point table of ``problem`` (default grid) into a file
        in ``directory`` and open it. Without ``directory`` the file is written to a
        temporary folder removed right after opening (the getters hold their rows
        as Python lists, or a memory map that stays valid on POSIX systems; where
        the removal fails the folder is left)."""
        axes, columns, meta = build_oppoint_columns(problem)
        if directory is not None:
            path = Path(directory) / "oppoints.eot"
            write_table(path, "oppoints", axes, columns, meta)
            return cls(Table.open(path), problem)
        with tempfile.TemporaryDirectory(
            prefix="energyopt-online-", ignore_cleanup_errors=True
        ) as tmp:
            path = Path(tmp) / "oppoints.eot"
            write_table(path, "oppoints", axes, columns, meta)
            return cls(Table.open(path), problem)

    def capacity_rps(self, label: str, gpu_type: str, clock: int, share: int) -> float:
        """SLO capacity of the slice (requests/s; 0 where no op exists)."""
        self.counter.count += 1
        return float(self._cap(label, gpu_type, clock, share))

    def slice_power_w(
        self, label: str, gpu_type: str, clock: int, share: int, rate_rps: float
    ) -> float:
        """Dynamic power of an open slice of the op at ``rate_rps`` req/s (W): its fixed
        part (charged from the moment the slice is opened, whatever its rate) plus
        its marginal part x the rate; NaN where no op exists."""
        self.counter.count += 1
        fixed, marginal, _ = self._line(label, gpu_type, clock, share)
        return float(fixed) + float(marginal) * max(rate_rps, 0.0)

    def raise_to(
        self, label: str, gpu_type: str, clock: int, share_used: int, load_rps: float
    ) -> tuple[int, int]:
        """(clock MHz, share) of the lowest clock >= ``clock`` whose free share covers
        ``load_rps``; (-1, -1) when none does (or the load is above the grid)."""
        self.counter.count += 1
        row = self._raise(label, gpu_type, clock, share_used, load_rps)
        return int(row[0]), int(row[1])

    def on_power_w(self, gpu_type: str, clock: int) -> float:
        """Static power of a GPU of ``gpu_type`` locked at ``clock`` (W)."""
        self.counter.count += 1
        return self._on_power[(gpu_type, clock)]
