"""Verbs on problem files of every family: validate, show, solve, verify, export,
schema, solvers, catalog. Each dispatches through the family registry, and imports
a family (its formulations and solvers) only when it runs."""

from __future__ import annotations

import argparse
import json
import math
from typing import TYPE_CHECKING, Any

from energyopt.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_INFEASIBLE,
    EXIT_NO_PLAN,
    EXIT_OK,
    EXIT_VIOLATION,
    err,
    output_path,
    positive_seconds,
    progress,
    relative_gap,
)
from energyopt.cli.documents import DOCUMENTS, catalog_shape, not_a_problem
from energyopt.families import families, family, kinds
from energyopt.spec.errors import SpecError

if TYPE_CHECKING:
    from energyopt.families import AnyFamily

FAMILY_SIGNS: tuple[tuple[str, str], ...] = (
    ("tasks", "taskgraph"),
    ("jobs", "colocation"),
    ("load", "evaluate"),
    ("base", "plans or kind: oppoints"),
)
"""A top-level key only a kind other than serving has, and that kind."""


def kind_of(path: str) -> str:
    """The file's ``kind``; SpecError naming ``kind`` when a file without one is
    plainly of another family (it would otherwise be read as a serving instance)."""
    from energyopt.spec.io import data_kind, read_data

    data = read_data(path)  # parsed once: a fleet of 10,240 GPUs takes seconds to parse
    kind = data_kind(data, path)
    if kind != "serving":
        return kind
    if "kind" not in data:
        shape = catalog_shape(data)
        if shape is not None:
            return shape
        for key, other in FAMILY_SIGNS:
            if key in data:
                raise SpecError(
                    [
                        f"{path}: kind: missing; a file with {key}: is not a serving instance "
                        f"(add kind: {other})"
                    ]
                )
        likely = likely_kind(data)
        if likely is not None:
            other, keys = likely
            known = ", ".join(kinds())
            shown = ", ".join(f"{k}:" for k in keys)
            raise SpecError(
                [
                    f"{path}: kind: missing; a file with {shown} is not a serving instance "
                    f"(kinds: {known}; add kind: {other})"
                ]
            )
    return kind


def likely_kind(data: dict[str, Any]) -> tuple[str, list[str]] | None:
    """The family whose file fields best cover the top-level keys of ``data`` that a
    serving instance does not have, and those keys; None when no family has any (a
    newer kind's file without ``kind:`` was refused with ~15 serving errors)."""

    def fields(model: Any) -> set[str]:
        return {f.alias or name for name, f in model.model_fields.items()}

    serving = fields(family("serving").problem_model)
    extra = [str(k) for k in data if str(k) not in serving]
    best: tuple[int, str, list[str]] | None = None
    for fam in families():
        if fam.kind == "serving":
            continue
        hits = [k for k in extra if k in fields(fam.problem_model)]
        if hits and (best is None or len(hits) > best[0]):
            best = (len(hits), fam.kind, hits)
    return None if best is None else (best[1], best[2])


def check_catalogs(catalogs: list[str]) -> None:
    """Read every ``--catalog`` file, whether or not the file's kind takes entries from
    a catalog (a keep-alive file names none, and a garbage catalog went unread);
    SpecError naming each catalog file and field."""
    if not catalogs:
        return
    from energyopt.catalog.loader import bind_catalog

    _, problems = bind_catalog(extra=catalogs)
    if problems:
        raise SpecError(problems)


def problem_family(path: str, catalogs: list[str], kind: str | None = None) -> AnyFamily:
    """The family of a problem file (``kind``: its ``kind_of``, read from the file when
    None); SpecError for documents and unknown kinds."""
    kind = kind_of(path) if kind is None else kind
    check_catalogs(list(catalogs))
    if kind in DOCUMENTS:
        raise not_a_problem(path, kind, catalogs)
    try:
        return family(kind)
    except SpecError as exc:
        known = ", ".join([*kinds(), *DOCUMENTS])
        raise SpecError([f"{path}: kind: unknown problem family {kind!r}; known: {known}"]) from exc


def cmd_validate(args: argparse.Namespace) -> int:
    failed = 0
    for path in args.files:
        try:
            kind = kind_of(path)
            if kind in DOCUMENTS:
                summary = DOCUMENTS[kind][0](path, args.catalog)
            else:
                fam = problem_family(path, args.catalog, kind)
                summary = fam.summary(fam.load(path, args.catalog))
        except SpecError as exc:
            failed += 1
            for line in exc.problems:
                err(line)
            continue
        print(f"{path}: ok ({summary})")
    return EXIT_BAD_INPUT if failed else EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    fam = problem_family(args.file, args.catalog)
    print("\n".join(fam.show(fam.load(args.file, args.catalog))))
    return EXIT_OK


def cmd_solve(args: argparse.Namespace) -> int:
    from energyopt.families import certify, solver_entry
    from energyopt.families.serving.pricing_context import pricing_context
    from energyopt.solvers.result import INFEASIBLE
    from energyopt.spec.io import dump

    fam = problem_family(args.file, args.catalog)
    entry = solver_entry(fam, args.solver)
    if args.output is not None:
        from energyopt.spec.io import file_format

        file_format(output_path(args.output))  # refuse an unknown suffix before the solve
    if args.scheduler is not None and fam.kind != "serving":
        raise SpecError(
            [f"--scheduler: {args.file} is a {fam.kind} problem; it applies to serving"]
        )
    problem = fam.load(args.file, args.catalog)
    say = progress(args.quiet)
    with pricing_context(args.scheduler):
        result = fam.solve(
            problem, entry.name, time_limit_s=args.time_limit, rel_gap=args.gap, progress=say
        )
    certify(fam, problem, result, args.gap if args.gap is not None else 1e-4, say)
    if result.plan is None:
        err(f"{args.file}: no plan ({result.status}) after {result.wall_s:.1f} s")
        for line in result.diagnosis:
            err(f"  - {line}")
        if result.status == INFEASIBLE:
            return EXIT_INFEASIBLE
        err(
            f"  - not proven infeasible: {entry.name} found no plan within its limits; "
            "a longer --time-limit or another solver (energyopt solvers) may find one"
        )
        return EXIT_NO_PLAN
    if result.fallback:
        err(f"{args.file}: {result.fallback}")
    print("\n".join(fam.report(problem, result)))
    if args.output:
        dump(fam.to_file(problem, result), args.output)
        print(f"plan written to {args.output}")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    from energyopt.families import check_stated
    from energyopt.spec.io import read_data

    fam = problem_family(args.instance, args.catalog)
    problem = fam.load_for_plan(args.instance, args.catalog)
    plan, stated = fam.from_file(problem, read_data(args.plan), args.plan)
    violations = fam.verify(problem, plan)
    cost = None
    if not violations:
        cost = fam.cost(problem, plan)
        violations = check_stated(fam, problem, plan, stated, fam.sense(problem), cost)
    if violations or cost is None:
        err(f"{args.plan}: {len(violations)} violation(s) of {args.instance}:")
        for v in violations:
            err(f"  - {v}")
        return EXIT_VIOLATION
    print(f"{args.plan}: feasible for {args.instance}")
    print(f"objective {figure(cost)} {fam.objective_unit(problem)} (recomputed from the plan)")
    return EXIT_OK


def figure(value: float) -> str:
    """``value`` with six significant digits in fixed notation and thousands separators
    (3,076,260 rather than 3.07626e+06); scientific notation only far from 1."""
    size = abs(value)
    if size == 0 or not 1e-3 <= size < 1e15:
        return f"{value:.6g}"
    digits = max(0, 5 - math.floor(math.log10(size)))
    return f"{value:,.{digits}f}"


def cmd_export(args: argparse.Namespace) -> int:
    from energyopt.families import NotExportable
    from energyopt.solvers.export import write_program

    suffix = output_path(args.output).suffix.lstrip(".").lower()
    if args.format and suffix in EXPORT_SUFFIXES and suffix != args.format:
        # other solvers read a model file by its suffix: LP text in x.mps is unreadable
        raise SpecError(
            [
                f"{args.output}: --format {args.format} does not match the suffix .{suffix}; "
                f"name the file .{args.format} or leave --format out"
            ]
        )
    fam = problem_family(args.file, args.catalog)
    fmt = args.format or suffix
    problem = fam.load(args.file, args.catalog)
    others = fam.exports(problem)
    if fmt in others:
        others[fmt](args.output)
        print(f"{fam.kind} {fmt} file of {args.file} written to {args.output}")
        return EXIT_OK
    if fmt not in ("mps", "lp"):
        known = ", ".join(["mps", "lp", *others])
        raise SpecError([f"{args.output}: --format: {known} for a {fam.kind} file (or by suffix)"])
    try:
        program = fam.program(problem)
    except NotExportable as exc:
        raise SpecError([f"{args.file}: {fam.kind}: {exc}"]) from None
    write_program(program, args.output, fmt)
    print(f"{fam.kind} program of {args.file} written to {args.output} ({fmt.upper()})")
    return EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    from pydantic import BaseModel

    from energyopt.spec.hardware import GpuType
    from energyopt.spec.llm import LlmModel

    models: dict[str, type[BaseModel]] = {"gpu": GpuType, "model": LlmModel}
    for fam in families():
        models[fam.kind] = fam.problem_model
        models[f"{fam.kind}-plan"] = fam.plan_model
    models["instance"] = models["serving"]
    models["plan"] = models["serving-plan"]
    if args.kind not in models:
        raise SpecError([f"schema: no file kind {args.kind!r}; known: {', '.join(models)}"])
    print(json.dumps(models[args.kind].model_json_schema(), indent=2))
    return EXIT_OK


def schema_kinds() -> list[str]:
    """Names ``energyopt schema`` accepts (imports no family)."""
    names = ["instance", "plan", "gpu", "model"]
    for kind in kinds():
        names += [kind, f"{kind}-plan"]
    return names


def cmd_solvers(args: argparse.Namespace) -> int:
    for fam in families():
        print(f"{fam.kind}: {fam.title}")
        for i, entry in enumerate(fam.solvers()):
            default = " (default)" if i == 0 else ""
            ok = "" if entry.available() else " [not available here]"
            print(f"  {entry.name:<16} {entry.guarantee:<16} {entry.description}{default}{ok}")
    return EXIT_OK


def cmd_catalog(args: argparse.Namespace) -> int:
    from energyopt.catalog import builtin_catalog

    cat = builtin_catalog()
    for g in cat.gpus.values():
        print(
            f"gpu   {g.name:<16} {g.sm_count} SMs, {g.memory_gb:g} GB, "
            f"{g.memory_bandwidth_gbps:g} GB/s, {g.peak_bf16_tflops:g} TFLOP/s, "
            f"{g.min_sm_clock_mhz}-{g.max_sm_clock_mhz} MHz, TDP {g.tdp_w:g} W"
        )
    for m in cat.models.values():
        print(
            f"model {m.name:<16} {m.params_total_b:g}B params ({m.params_active_b:g}B active), "
            f"{m.layers} layers, {m.weight_bytes / 1e9:.1f} GB"
        )
    return EXIT_OK


EXPORT_SUFFIXES = ("mps", "lp", "csv")
"""The formats ``export`` writes, each also the suffix of its file."""

CATALOG_HELP = "extra catalog file (gpus:/models: lists); overrides entries by name"

DEFAULT_LIMITS = (
    "60 s for every solver of every kind but serving; a serving solver's preset sets its "
    "own (solvers/*.toml: 60 s for auto; 120 s for highs-exact, highs-per-gpu, highs-pattern, "
    "highs-plain, bnp, cpsat and pop; 30 s for shadow-price and colgen)"
)
"""The time limits ``solve`` uses without ``--time-limit`` (tests/test_cli_inputs.py
checks them against the families and the presets)."""

DEFAULT_GAPS = (
    "0.0001; colocation shadow-price 0.001; serving: the preset's, 0.01 for shadow-price, "
    "colgen and pop, 0.001 for bnp; collective solvers take none"
)
"""The relative gaps ``solve`` stops at without ``--gap``."""


def configure(sub: Any) -> None:
    """Add the problem verbs to the ``energyopt`` subcommands."""
    p = sub.add_parser("schema", help="print the JSON Schema of a file kind")
    p.add_argument("kind", nargs="?", default="instance", choices=schema_kinds())
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser("validate", help="check problem files and specs of every kind")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("show", help="print a problem (serving: its operating points)")
    p.add_argument("file")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("solve", help="find the best plan of a problem file of any kind")
    p.add_argument("file")
    p.add_argument(
        "--solver", default=None, help="solver name (energyopt solvers) or preset TOML file"
    )
    p.add_argument(
        "--time-limit",
        type=positive_seconds,
        default=None,
        metavar="SECONDS",
        help=f"wall-clock limit of the solve, above 0 (default: {DEFAULT_LIMITS})",
    )
    p.add_argument(
        "--gap",
        type=relative_gap,
        default=None,
        help=f"relative gap to stop at, from 0 below 1, e.g. 0.005 (default: {DEFAULT_GAPS})",
    )
    p.add_argument("-o", "--output", help="write the plan (JSON, YAML or TOML by suffix)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="serving: price column generation on a Dask cluster (an address, or local:N "
        "for N local worker processes; needs energyopt[dask])",
    )
    p.set_defaults(func=cmd_solve)

    p = sub.add_parser("verify", help="check a plan file against its problem file")
    p.add_argument("instance")
    p.add_argument("plan")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser(
        "export",
        help="write a problem's MILP as MPS or LP for other solvers (a collective file's "
        "NCCL tuner config as CSV)",
    )
    p.add_argument("file")
    p.add_argument("-o", "--output", required=True, help="file to write (.mps, .lp or .csv)")
    p.add_argument(
        "--format",
        choices=EXPORT_SUFFIXES,
        default=None,
        help="default: by suffix (a different known suffix is refused)",
    )
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("catalog", help="list the embedded GPU types and models")
    p.set_defaults(func=cmd_catalog)

    p = sub.add_parser("solvers", help="list every family's solvers and what each guarantees")
    p.set_defaults(func=cmd_solvers)

    for name in ("validate", "show", "solve", "verify", "export"):
        sub.choices[name].add_argument(
            "--catalog", action="append", default=[], metavar="FILE", help=CATALOG_HELP
        )
