"""Runtime policy for collectives: a table keyed by (collective, message size,
health summary) that returns the schedule in constant time, its file, and the
NCCL tuner-plugin export.

The health summary is the slowest link's factor and the straggler count. Each
cell is solved by selection on the topology under a representative state of its
summary (collective.md, section 6): the cell's factor on the first rank's NIC
(its NVLink port on one node) and that many stragglers of the cell's slowdown
at the end of the rank order. A lookup rounds the size down to its power-of-two
bucket, the factor down to the next cell value and caps the straggler count:
three index computations and one dictionary access. ``localize`` then fits the
cell's placement-dependent parameters (rail weights, tree leaves) to the actual
state in O(n).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from energyopt.families.collective.formulations.costmodel import Flows
from energyopt.families.collective.formulations.model import CollectiveProblem
from energyopt.families.collective.solvers.select import (
    CHANNELS,
    CHUNKS,
    QUICK,
    Evaluator,
    Group,
    Structure,
    Winners,
    search_group,
)
from energyopt.families.collective.spec import (
    ALGORITHMS,
    PROTOCOLS,
    Algorithm,
    Choice,
    Health,
    LinkHealth,
    Op,
    Protocol,
    Straggler,
)
from energyopt.progress import Progress, quiet
from energyopt.spec.io import write_text_atomic
from energyopt.tables.format import ColumnData, Table, TableError, write_table
from energyopt.tables.stdlib_reader import Axis

FACTORS = (1.0, 0.75, 0.5, 0.25)
"""Slowest-link factors of the table's cells, descending."""
STRAGGLER_SLOWDOWN = 2.0
"""Slowdown of the representative stragglers."""
NCCL_ALGORITHM = {"ring": "ring", "tree": "tree"}
NCCL_OP = {
    "all_reduce": "allreduce",
    "all_gather": "allgather",
    "reduce_scatter": "reducescatter",
    "broadcast": "broadcast",
}
TUNER_HEADER = (
    "# energyopt collective policy in the NCCL example tuner plugin's format\n"
    "# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,"
    "numPipeOps,regBuff\n"
)


@dataclass(frozen=True)
class HealthSummary:
    """What the table is keyed by besides collective and size."""

    slowest_factor: float
    stragglers: int


def summarize(health: Health) -> HealthSummary:
    """The summary of a health state."""
    worst = min((lh.factor for lh in health.links), default=1.0)
    return HealthSummary(worst, len(health.stragglers))


def representative(p: CollectiveProblem, h: HealthSummary) -> Health:
    """The health state a cell is solved under."""
    links: tuple[LinkHealth, ...] = ()
    if h.slowest_factor < 1.0:
        kind = "nic" if p.n_nodes > 1 else "nvlink"
        links = (LinkHealth(gpu=p.ranks[0], link=kind, factor=h.slowest_factor),)
    slow = tuple(
        Straggler(gpu=p.ranks[p.n - 1 - i], slowdown=STRAGGLER_SLOWDOWN)
        for i in range(h.stragglers)
    )
    return Health(links=links, stragglers=slow)


@dataclass
class Policy:
    """The compiled table: cells[(op, log2 size, factor index, stragglers)] = choice."""

    sizes_log2: tuple[int, ...]
    max_stragglers: int
    n_nodes: int
    n_ranks: int
    cells: dict[tuple[str, int, int, int], Choice]
    unsearched: int = 0
    """Cells a time limit kept from the full search (they hold the best schedule
    found; not stored in the file)."""

    def key(self, op: str, nbytes: int, health: HealthSummary) -> tuple[str, int, int, int]:
        """The cell of a collective: size rounded down to its bucket, factor down to
        the next cell value, straggler count capped."""
        b = max(self.sizes_log2[0], min(self.sizes_log2[-1], int(math.log2(max(1, nbytes)))))
        b = max(s for s in self.sizes_log2 if s <= b)
        f = next(
            (i for i, x in enumerate(FACTORS) if health.slowest_factor >= x - 1e-12),
            len(FACTORS) - 1,
        )
        return (op, b, f, min(health.stragglers, self.max_stragglers))

    def lookup(self, op: str, nbytes: int, health: HealthSummary) -> Choice:
        """The schedule of a collective under a health summary (constant time)."""
        return self.cells[self.key(op, nbytes, health)]


def nccl_structures(op: Op) -> Iterator[Structure]:
    """The ring and tree schedules NCCL can run (its tree is all-reduce only)."""
    for alg in ("ring", "tree"):
        if alg == "tree" and op != "all_reduce":
            continue
        for ch in CHANNELS:
            for k in CHUNKS if (alg == "tree" or op == "broadcast") else (1,):
                yield Structure(alg, ch, k, None, 0)


def compile_policy(
    p: CollectiveProblem,
    ops: tuple[Op, ...],
    sizes_log2: tuple[int, ...],
    max_stragglers: int = 2,
    nccl_only: bool = False,
    *,
    healthy_only: bool = False,
    time_limit_s: float | None = None,
    progress: Progress = quiet,
) -> Policy:
    """Solve every cell by selection (``nccl_only``: among NCCL's algorithms only);
    all sizes of one op and health state are scored together. Within
    ``time_limit_s`` seconds when given: every cell first gets a cheap schedule
    (one-channel direct; a one-channel ring for ``nccl_only``), then the states
    and ops are searched in order until the limit (``Policy.unsearched`` counts the
    cells the limit cut). ``healthy_only``: only the cells of the healthy state
    (what the NCCL tuner config holds)."""
    t0 = time.perf_counter()
    deadline = None if time_limit_s is None else t0 + time_limit_s
    sizes = np.asarray([float(1 << b) for b in sizes_log2])
    states = [(fi, f, k) for fi, f in enumerate(FACTORS) for k in range(max_stragglers + 1)]
    if healthy_only:
        states = states[:1]
    evs: dict[int, Evaluator] = {}
    groups: dict[tuple[int, Op], Group] = {}
    shared: dict[tuple[str, int, Structure], Flows] = {}
    for si, (_, f, k) in enumerate(states):
        evs[si] = Evaluator(p.with_health(representative(p, HealthSummary(f, k))), shared)
        for op in ops:
            g = Group(op, 0, sizes, [], Winners.empty(len(sizes)))
            if deadline is not None:
                quick = Structure("ring", 1, 1, None, 0) if nccl_only else QUICK
                evs[si].offer_best(g.winners, op, 0, quick, sizes)
            groups[(si, op)] = g
    for si, (_, f, k) in enumerate(states):
        if deadline is not None and time.perf_counter() >= deadline:
            progress(f"policy: time limit reached at health state {si + 1} of {len(states)}")
            break
        for op in ops:
            g = groups[(si, op)]
            search_group(evs[si], g, deadline, nccl_structures(op) if nccl_only else None)
            progress(
                f"policy: health state {si + 1} of {len(states)} (slowest link {f:g}, {k} "
                f"straggler(s)), {op} x {len(sizes)} sizes: "
                f"{'searched' if g.searched else 'stopped by the time limit'}, "
                f"{time.perf_counter() - t0:.1f} s"
            )
    cells: dict[tuple[str, int, int, int], Choice] = {}
    unsearched = 0
    for (si, op), g in groups.items():
        fi, _, k = states[si]
        unsearched += 0 if g.searched else len(sizes)
        for j, b in enumerate(sizes_log2):
            cells[(op, b, fi, k)] = g.winners.scored(j, f"{op}:{1 << b}").choice
    return Policy(tuple(sizes_log2), max_stragglers, p.n_nodes, p.n, cells, unsearched)


def localize(choice: Choice, p: CollectiveProblem) -> Choice:
    """A cell's schedule fitted to the actual health of ``p`` (which rails and ranks
    are slow, not only how many): rail weights from the actual NICs and stragglers,
    the tree order with the actual stragglers as leaves. O(n); every rank that acts
    on the same health state computes the same schedule."""
    from energyopt.families.collective.solvers.select import rail_weights

    update: dict[str, Any] = {}
    if choice.rail_weights is not None:
        w = rail_weights(p)
        update["rail_weights"] = w
    if choice.algorithm == "tree" and choice.leaves > 0:
        slow = [r for r in range(p.n) if p.slowdown[r] > 1.0]
        if slow:
            rest = [r for r in range(p.n) if r not in slow]
            update["order"] = (*rest, *slow)
            update["leaves"] = len(slow)
        else:
            update["order"] = None
            update["leaves"] = 0
    return choice.model_copy(update=update) if update else choice


POLICY_KIND = "collective-policy"
"""The ``kind`` of a policy table file."""
CELL_AXES = ("op", "size_log2", "factor", "stragglers")


def write_policy(policy: Policy, path: str | Path) -> None:
    """Write the policy as a table file of the lookup compiler's format (docs/tables.md),
    keyed by op, size_log2 (the bucket ``Policy.key`` rounds a size down to), factor
    (index into ``FACTORS``) and stragglers: per cell the algorithm and protocol
    (indices into the lists in its metadata), chunks, channels, clock (MHz), tree
    leaves, predicted time (us) and energy (J), and the representative state's rank
    order and rail weights (``has_order``, ``has_weights``: whether the cell has
    them; ``localize`` refits both to the actual state)."""
    ops = tuple(sorted({k[0] for k in policy.cells}))
    sizes = policy.sizes_log2
    factors = tuple(range(len(FACTORS)))
    strag = tuple(range(policy.max_stragglers + 1))
    n = policy.n_ranks
    rails = max(1, n // max(1, policy.n_nodes))
    shape = (len(ops), len(sizes), len(factors), len(strag))
    ints = {name: np.zeros(shape, dtype=np.int64) for name in _INT_FIELDS}
    floats = {name: np.full(shape, np.nan) for name in ("time_us", "energy_j")}
    order = np.full((*shape, n), -1, dtype=np.int64)
    weights = np.full((*shape, rails), np.nan)
    for (op, b, f, k), ch in policy.cells.items():
        if ch.algorithm == "synthesized":
            raise ValueError(f"cell {op} 2^{b}: a synthesized schedule has no table form")
        at = (ops.index(op), sizes.index(b), f, k)
        ints["algorithm"][at] = ALGORITHMS.index(ch.algorithm)
        ints["protocol"][at] = PROTOCOLS.index(ch.protocol)
        ints["chunks"][at] = ch.chunks
        ints["channels"][at] = ch.channels
        ints["clock_mhz"][at] = ch.clock_mhz
        ints["leaves"][at] = ch.leaves
        floats["time_us"][at] = np.nan if ch.time_us is None else ch.time_us
        floats["energy_j"][at] = np.nan if ch.energy_j is None else ch.energy_j
        if ch.order is not None:
            ints["has_order"][at] = 1
            order[at] = ch.order
        if ch.rail_weights is not None:
            ints["has_weights"][at] = 1
            weights[at][: len(ch.rail_weights)] = ch.rail_weights
    axes = [
        Axis("op", "category", ops),
        Axis("size_log2", "exact", sizes),
        Axis("factor", "exact", factors),
        Axis("stragglers", "exact", strag),
        Axis("rank", "exact", tuple(range(n))),
        Axis("rail", "exact", tuple(range(rails))),
    ]
    units = {"clock_mhz": "MHz"}
    columns = {
        name: ColumnData(arr, CELL_AXES, "<i4", -1, units.get(name, ""))
        for name, arr in ints.items()
    }
    columns["time_us"] = ColumnData(floats["time_us"], CELL_AXES, "<f8", float("nan"), "us")
    columns["energy_j"] = ColumnData(floats["energy_j"], CELL_AXES, "<f8", float("nan"), "J")
    columns["order"] = ColumnData(order, (*CELL_AXES, "rank"), "<i4", -1)
    columns["rail_weight"] = ColumnData(weights, (*CELL_AXES, "rail"), "<f8", float("nan"))
    meta = {
        "algorithms": list(ALGORITHMS),
        "protocols": list(PROTOCOLS),
        "factors": list(FACTORS),
        "sizes_log2": list(sizes),
        "max_stragglers": policy.max_stragglers,
        "n_nodes": policy.n_nodes,
        "n_ranks": n,
    }
    write_table(path, POLICY_KIND, axes, columns, meta)


_INT_FIELDS = (
    "algorithm",
    "protocol",
    "chunks",
    "channels",
    "clock_mhz",
    "leaves",
    "has_order",
    "has_weights",
)


def read_policy(path: str | Path) -> Policy:
    """A policy table file back as a Policy (TableError, naming the file, if it is not
    one)."""
    t = Table.open(path)
    if t.kind != POLICY_KIND:
        raise TableError(str(path), f"a {t.kind!r} table, not a {POLICY_KIND!r} one")
    meta = t.meta
    ops = [str(v) for v in t.axes["op"].values]
    sizes = tuple(int(v) for v in meta["sizes_log2"])
    algorithms: list[Algorithm] = list(meta["algorithms"])
    protocols: list[Protocol] = list(meta["protocols"])
    a = {name: t.array(name) for name in (*_INT_FIELDS, "time_us", "energy_j")}
    order, weights = t.array("order"), t.array("rail_weight")
    cells: dict[tuple[str, int, int, int], Choice] = {}
    for i, op in enumerate(ops):
        for j, b in enumerate(sizes):
            for f in range(len(meta["factors"])):
                for k in range(int(meta["max_stragglers"]) + 1):
                    at = (i, j, f, k)
                    w = weights[at]
                    cells[(op, b, f, k)] = Choice(
                        collective=f"{op}:{1 << b}",
                        algorithm=algorithms[int(a["algorithm"][at])],
                        protocol=protocols[int(a["protocol"][at])],
                        chunks=int(a["chunks"][at]),
                        channels=int(a["channels"][at]),
                        clock_mhz=int(a["clock_mhz"][at]),
                        leaves=int(a["leaves"][at]),
                        order=tuple(int(x) for x in order[at]) if a["has_order"][at] else None,
                        rail_weights=(
                            tuple(float(x) for x in w[~np.isnan(w)])
                            if a["has_weights"][at]
                            else None
                        ),
                        time_us=None if np.isnan(a["time_us"][at]) else float(a["time_us"][at]),
                        energy_j=(
                            None if np.isnan(a["energy_j"][at]) else float(a["energy_j"][at])
                        ),
                    )
    return Policy(
        sizes, int(meta["max_stragglers"]), int(meta["n_nodes"]), int(meta["n_ranks"]), cells
    )


def tuner_lines(policy: Policy, factor_index: int = 0, stragglers: int = 0) -> list[str]:
    """The policy's cells of one health summary as NCCL tuner CSV lines, contiguous size
    ranges merged; only ring and tree cells (the algorithms NCCL has), nNodes and
    nRanks of the topology, any pipeline count and buffer type."""
    lines: list[str] = []
    for op, nccl_op in NCCL_OP.items():
        sizes = sorted(
            b for (o, b, f, k) in policy.cells if o == op and f == factor_index and k == stragglers
        )
        runs: list[tuple[int, int, Choice]] = []
        for i, b in enumerate(sizes):
            ch = policy.cells[(op, b, factor_index, stragglers)]
            if ch.algorithm not in NCCL_ALGORITHM:
                continue
            lo = 0 if i == 0 else 1 << b
            hi = (1 << sizes[i + 1]) - 1 if i + 1 < len(sizes) else 4294967295
            if (
                runs
                and runs[-1][2].algorithm == ch.algorithm
                and runs[-1][2].protocol == ch.protocol
                and runs[-1][2].channels == ch.channels
                and runs[-1][1] + 1 == lo
            ):
                runs[-1] = (runs[-1][0], hi, ch)
            else:
                runs.append((lo, hi, ch))
        for lo, hi, ch in runs:
            lines.append(
                f"{nccl_op},{lo},{hi},{NCCL_ALGORITHM[ch.algorithm]},{ch.protocol},{ch.channels},"
                f"{policy.n_nodes},{policy.n_ranks},-1,-1"
            )
    return lines


def write_tuner_conf(
    policy: Policy, path: str | Path, factor_index: int = 0, stragglers: int = 0
) -> None:
    write_text_atomic(
        path, TUNER_HEADER + "\n".join(tuner_lines(policy, factor_index, stragglers)) + "\n"
    )


@dataclass(frozen=True)
class TunerRow:
    """One line of an NCCL tuner config as the plugin reads it."""

    collective: str
    min_bytes: int
    max_bytes: int
    algorithm: str
    protocol: str
    channels: int
    n_nodes: int
    n_ranks: int
    num_pipe_ops: int
    reg_buff: int


TUNER_ALGORITHMS = {"tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat"}
TUNER_PROTOCOLS = {"ll", "ll128", "simple"}
TUNER_COLLECTIVES = {"broadcast", "reduce", "allgather", "reducescatter", "allreduce"}


def parse_tuner_conf(text: str) -> list[TunerRow]:
    """Parse a tuner config as the example plugin does (comments and blank lines
    skipped; 8 to 10 comma-separated fields; the last two optional, default -1);
    ValueError naming the line for anything the plugin would not accept."""
    rows: list[TunerRow] = []
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        f = [x.strip() for x in line.split(",")]
        if not 8 <= len(f) <= 10:
            raise ValueError(f"line {no}: {len(f)} fields, expected 8 to 10")
        f += ["-1"] * (10 - len(f))
        if (
            f[0] not in TUNER_COLLECTIVES
            or f[3] not in TUNER_ALGORITHMS
            or f[4] not in TUNER_PROTOCOLS
        ):
            raise ValueError(f"line {no}: unknown collective, algorithm or protocol")
        row = TunerRow(f[0], int(f[1]), int(f[2]), f[3], f[4], *(int(x) for x in f[5:]))
        if row.min_bytes > row.max_bytes or row.max_bytes > 4294967295:
            raise ValueError(f"line {no}: size range {row.min_bytes}..{row.max_bytes}")
        rows.append(row)
    return rows


DEFAULT_TIME_LIMIT_S = 600.0
"""Default bound on one compilation of ``main``, s (a 64-GPU topology's full search
takes far longer; the command says how many cells the bound cut)."""
DEFAULT_SIZES_LOG2 = tuple(range(10, 31, 2))
"""Message sizes of a compiled policy: 1 KiB to 1 GiB, every power of 4 (log2 bytes)."""


def write_healthy_tuner_conf(
    p: CollectiveProblem,
    path: str | Path,
    sizes_log2: tuple[int, ...] = DEFAULT_SIZES_LOG2,
    *,
    time_limit_s: float | None = None,
    progress: Progress = quiet,
) -> None:
    """The NCCL example tuner plugin's config for ``p``'s topology with every link
    healthy and no straggler (ring/tree choices; all-to-all is not in its format)."""
    from energyopt.families.collective.spec import OPS

    ops = tuple(o for o in OPS if o != "all_to_all")
    healthy = p.with_health(Health())
    policy = compile_policy(
        healthy,
        ops,
        sizes_log2,
        0,
        nccl_only=True,
        healthy_only=True,
        time_limit_s=time_limit_s,
        progress=progress,
    )
    write_tuner_conf(policy, path)


def main(argv: list[str] | None = None) -> int:
    """``python -m energyopt.families.collective.tables FILE``: compile the runtime policy of a
    collective file's topology and write it (``--policy``) and/or its NCCL tuner
    config for the healthy state (``--tuner-conf``); with neither, exit 2 saying so.
    Progress on stderr (``-q``: none); ``--time-limit`` bounds each compilation
    (default ``DEFAULT_TIME_LIMIT_S``; cells it cuts keep the best schedule found,
    and the command says how many). Exit 2 with one line per problem for bad input."""
    import argparse
    import sys

    from energyopt.families.collective.formulations.model import load_collective
    from energyopt.families.collective.spec import OPS
    from energyopt.spec.errors import SpecError

    ap = argparse.ArgumentParser(
        prog="python -m energyopt.families.collective.tables", description=main.__doc__
    )
    ap.add_argument("file", help="a kind: collective file (its topology; health is ignored)")
    ap.add_argument(
        "--policy", help="write the policy table (the lookup compiler's format, e.g. policy.eot)"
    )
    ap.add_argument("--tuner-conf", help="write the NCCL example tuner plugin's CSV")
    ap.add_argument(
        "--sizes-log2",
        default=f"{DEFAULT_SIZES_LOG2[0]}:{DEFAULT_SIZES_LOG2[-1]}:2",
        help="first:last:step of log2 bytes",
    )
    ap.add_argument("--max-stragglers", type=int, default=2)
    ap.add_argument(
        "--time-limit",
        type=float,
        default=DEFAULT_TIME_LIMIT_S,
        metavar="SECONDS",
        help="bound on each compilation (policy, tuner config); cells it cuts keep the "
        f"best schedule found (default {DEFAULT_TIME_LIMIT_S:g})",
    )
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()

    def progress(line: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - t0:7.1f}s] {line}", file=sys.stderr, flush=True)

    try:
        try:
            first, last, step = (int(x) for x in args.sizes_log2.split(":"))
        except ValueError:
            raise SpecError(
                [f"--sizes-log2: {args.sizes_log2!r}: expected first:last:step"]
            ) from None
        if not (0 <= first <= last <= 36 and step >= 1):
            raise SpecError(
                [f"--sizes-log2: {args.sizes_log2!r}: need 0 <= first <= last <= 36, step >= 1"]
            )
        if not 0 <= args.max_stragglers <= 8:
            raise SpecError([f"--max-stragglers: {args.max_stragglers}: 0 to 8"])
        limit = args.time_limit
        if not (math.isfinite(limit) and limit > 0):
            raise SpecError([f"--time-limit: {limit}: a positive number of seconds"])
        p = load_collective(args.file).with_health(Health())
        sizes = tuple(range(first, last + 1, step))
        ops = tuple(o for o in OPS if o != "all_to_all")
        if not (args.policy or args.tuner_conf):
            raise SpecError(["nothing to write: give --policy FILE and/or --tuner-conf FILE"])
        if args.policy:
            policy = compile_policy(
                p, ops, sizes, args.max_stragglers, time_limit_s=limit, progress=progress
            )
            write_policy(policy, args.policy)
            print(f"policy of {args.file} written to {args.policy}")
            if policy.unsearched:
                print(
                    f"time limit: {policy.unsearched} of {len(policy.cells)} cells were not "
                    "searched in full (they hold the best schedule found)"
                )
        if args.tuner_conf:
            write_healthy_tuner_conf(
                p, args.tuner_conf, sizes, time_limit_s=limit, progress=progress
            )
            print(f"NCCL tuner config of {args.file} written to {args.tuner_conf}")
    except SpecError as exc:
        for line in exc.problems:
            print(line, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
