"""The ``energyopt`` command."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from energyopt import __version__
from energyopt.catalog.loader import Catalog
from energyopt.catalog.problem import Problem, load_problem
from energyopt.spec.errors import SpecError

EXIT_OK = 0
EXIT_VIOLATION = 1
EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 3
EXIT_INTERNAL = 4


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _progress(quiet: bool) -> Callable[[str], None]:
    """Progress lines on the terminal's stderr, even while a solver captures output."""
    start = time.perf_counter()
    stream = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1) if not quiet else None

    def say(line: str) -> None:
        if stream is not None:
            stream.write(f"[{time.perf_counter() - start:6.1f}s] {line}\n")

    return say


def cmd_schema(args: argparse.Namespace) -> int:
    from pydantic import BaseModel

    from energyopt.spec import Instance, Plan
    from energyopt.spec.hardware import GpuType
    from energyopt.spec.llm import LlmModel

    models: dict[str, type[BaseModel]] = {
        "instance": Instance,
        "plan": Plan,
        "gpu": GpuType,
        "model": LlmModel,
    }
    print(json.dumps(models[args.kind].model_json_schema(), indent=2))
    return EXIT_OK


def _load(path: str, catalogs: list[str] | None = None, check_slos: bool = True) -> Problem:
    """The problem of a serving instance file, checked as every command needs it:
    schema, catalog names, catalog-dependent ranges and (``check_slos``) SLOs that
    some GPU can meet. SpecError naming the file and the field otherwise."""
    from energyopt.perf.reachability import unreachable_slos
    from energyopt.spec.checks import instance_problems

    problem = load_problem(path, catalogs or ())
    problems = instance_problems(
        problem.instance, problem.catalog.gpus, problem.catalog.models, path
    )
    if problems:
        raise SpecError(problems)
    if check_slos:
        problems = unreachable_slos(problem)
        if problems:
            raise SpecError([f"{path}: {p}" for p in problems])
    return problem


# Problem families other than serving: the top-level ``kind:`` of a file names the
# family; its module provides ``validate_file(path, catalogs) -> str`` (a one-line
# summary, or SpecError) and ``solve_file(args) -> int`` (an exit code).
FAMILY_MODULES: dict[str, str] = {
    "colocation": "energyopt.cli_colocation",
    "taskgraph": "energyopt.cli_taskgraph",
    "plans": "energyopt.cli_compile_spec",
    "oppoints": "energyopt.cli_compile_spec",
    "evaluate": "energyopt.cli_evaluate",
}


def _family(path: str) -> Any | None:
    """The CLI module of the file's problem family, or None for a serving instance."""
    from energyopt.spec.io import file_kind

    kind = file_kind(path)
    if kind == "serving":
        _missing_kind(path)
        return None
    module = FAMILY_MODULES.get(kind)
    if module is None:
        known = ", ".join(["serving", *FAMILY_MODULES])
        raise SpecError([f"{path}: kind: unknown problem family {kind!r}; known: {known}"])
    return importlib.import_module(module)


FAMILY_SIGNS: tuple[tuple[str, str], ...] = (
    ("tasks", "taskgraph"),
    ("jobs", "colocation"),
    ("load", "evaluate"),
    ("base", "plans or kind: oppoints"),
)
"""A top-level key only a family other than serving has, and that family's kind."""


def _missing_kind(path: str) -> None:
    """SpecError naming ``kind`` when a file without one is plainly of another family
    (it would otherwise be read as a serving instance, and every key be 'extra')."""
    from energyopt.spec.io import read_data

    data = read_data(path)
    if "kind" in data:
        return
    for key, kind in FAMILY_SIGNS:
        if key in data:
            raise SpecError(
                [
                    f"{path}: kind: missing; a file with {key}: is not a serving instance "
                    f"(add kind: {kind})"
                ]
            )


def cmd_validate(args: argparse.Namespace) -> int:
    failed = 0
    for path in args.files:
        try:
            family = _family(path)
            if family is not None:
                print(f"{path}: ok ({family.validate_file(path, args.catalog)})")
                continue
            problem = _load(path, args.catalog)
        except SpecError as exc:
            failed += 1
            for line in exc.problems:
                _err(line)
            continue
        inst = problem.instance
        print(f"{path}: ok ({len(problem.gpus)} GPUs, {len(inst.workloads)} workloads)")
    return EXIT_BAD_INPUT if failed else EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    from energyopt.perf.oppoints import build_op_table
    from energyopt.report import format_problem

    problem = _load(args.file, args.catalog)
    print("\n".join(format_problem(problem, build_op_table(problem))))
    return EXIT_OK


def cmd_solve(args: argparse.Namespace) -> int:
    from energyopt.report import format_plan, format_totals
    from energyopt.solvers.presets import load_preset
    from energyopt.solvers.result import INFEASIBLE
    from energyopt.solvers.serving import solve
    from energyopt.spec.io import dump
    from energyopt.verify.serving import evaluate_plan

    family = _family(args.file)
    if family is not None:
        return int(family.solve_file(args))
    preset = load_preset(args.solver)
    problem = _load(args.file, args.catalog)
    say = _progress(args.quiet)
    say(f"solving {args.file} with {preset.name}")
    result = solve(problem, preset, time_limit_s=args.time_limit, rel_gap=args.gap, progress=say)
    if result.status == INFEASIBLE or result.plan is None:
        _err(f"{args.file}: no plan ({result.status}) after {result.wall_s:.1f} s")
        for line in result.diagnosis:
            _err(f"  - {line}")
        return EXIT_INFEASIBLE
    plan = result.plan
    ev = evaluate_plan(problem, plan)
    print(f"plan for {problem.instance.name} ({args.file})")
    print("\n".join(format_plan(problem, plan, ev)))
    print("\n".join(format_totals(problem, plan, ev, result)))
    if args.output:
        dump(plan, args.output)
        print(f"plan written to {args.output}")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    from energyopt.report import format_totals
    from energyopt.spec import Plan
    from energyopt.spec.checks import plan_problems
    from energyopt.spec.io import load
    from energyopt.verify.serving import check_reported, evaluate_plan

    problem = _load(args.instance, args.catalog, check_slos=False)
    plan = load(Plan, args.plan)
    mode = problem.instance.options.sharing.mode
    structural = plan_problems(plan, problem.catalog.gpus, args.plan, mode)
    if structural:
        _err(f"{args.plan}: {len(structural)} violation(s) of {args.instance}:")
        for line in structural:
            _err(f"  - {line.removeprefix(args.plan + ': ')}")
        return EXIT_VIOLATION
    ev = evaluate_plan(problem, plan)
    violations = ev.violations + check_reported(problem, plan, ev)
    if violations:
        _err(f"{args.plan}: {len(violations)} violation(s) of {args.instance}:")
        for v in violations:
            _err(f"  - {v}")
        return EXIT_VIOLATION
    print(f"{args.plan}: feasible for {args.instance}")
    print("\n".join(format_totals(problem, plan, ev, None)))
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


def cmd_solvers(args: argparse.Namespace) -> int:
    from energyopt.solvers.presets import available_presets, load_preset

    for name in available_presets():
        p = load_preset(name)
        print(f"{name:<16} {p.description}")
    return EXIT_OK


EXIT_DEVICE = 5
EXIT_SIGNAL = 130


def _nvml_errors(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Executor errors become a message and exit status 5 (130 if interrupted)."""

    def run(args: argparse.Namespace) -> int:
        from energyopt.nvml.errors import ApplyInterrupted, ExecutorError

        try:
            return fn(args)
        except ExecutorError as exc:
            _err(f"energyopt {args.command}: {exc}")
            return EXIT_SIGNAL if isinstance(exc, ApplyInterrupted) else EXIT_DEVICE

    return run


def _nvml_catalog(files: list[str]) -> Catalog:
    from energyopt.catalog import builtin_catalog, load_catalog_file

    cat = builtin_catalog()
    for path in files:
        gpus, models = load_catalog_file(path)
        cat = cat.merged(gpus, models)
    return cat


@_nvml_errors
def cmd_apply(args: argparse.Namespace) -> int:
    from energyopt.nvml.errors import ExecutorError
    from energyopt.nvml.planner import (
        mig_parted_yaml,
        parse_map_options,
        plan_actions,
        read_map_file,
    )
    from energyopt.nvml.session import open_session
    from energyopt.nvml.transaction import Transaction
    from energyopt.spec import Plan
    from energyopt.spec.checks import plan_problems
    from energyopt.spec.io import load, write_text_atomic

    plan = load(Plan, args.plan)
    catalog = _nvml_catalog(args.catalog)
    problems = plan_problems(plan, catalog.gpus, args.plan)
    if problems:
        raise SpecError(problems)
    mapping = read_map_file(args.map_file) if args.map_file else {}
    mapping.update(parse_map_options(args.map))
    with open_session() as session:
        ctx = session.ctx
        host = plan_actions(plan, ctx.nvml, catalog, mapping or None, args.mps_dir)
        originals = [a.read(ctx) for a in host.actions]
        verb = "applying" if args.apply else "dry run (nothing is changed; add --apply)"
        print(f"{verb}: {args.plan} on the {ctx.nvml.kind} backend")
        for gpu, dev in host.devices.items():
            print(f"{gpu} -> GPU {dev.index}  {dev.name}  {dev.uuid}")
            for a, o in zip(host.actions, originals, strict=True):
                if a.gpu != gpu:
                    continue
                state = "already in place" if a.is_noop(o) else f"now {a.show(o)}"
                print(f"  {a.describe()} ({state})")
        for gpu, envs in host.client_envs.items():
            print(f"MPS: start each serving process of {gpu} with:")
            for workload, env in envs:
                print(f"  {workload}: " + " ".join(f"{k}={v}" for k, v in env.items()))
        for note in host.notes:
            print(f"note: {note}")
        changes = sum(not a.is_noop(o) for a, o in zip(host.actions, originals, strict=True))
        print(f"{changes} change(s), {len(host.actions) - changes} already in place")
        if args.mig_config:
            text = mig_parted_yaml(plan, host.devices, args.mig_config_name or plan.instance)
            try:
                write_text_atomic(args.mig_config, text)
            except SpecError as exc:
                raise ExecutorError(f"cannot write {args.mig_config}: {exc}") from None
            print(f"mig-parted config written to {args.mig_config}")
        if not args.apply:
            return EXIT_OK
        checkpoint = args.checkpoint or time.strftime("energyopt-checkpoint-%Y%m%d-%H%M%S.json")
        report = Transaction(ctx, host.actions, checkpoint, say=print).run()
        if report.checkpoint is None:
            print("nothing to change: the plan is already in place")
        else:
            print(
                f"applied {len(report.applied)} change(s); originals saved in "
                f"{report.checkpoint}; undo with `energyopt restore {report.checkpoint}`"
            )
    return EXIT_OK


@_nvml_errors
def cmd_restore(args: argparse.Namespace) -> int:
    from energyopt.nvml.session import open_session
    from energyopt.nvml.transaction import restore

    with open_session() as session:
        count, errors = restore(session.ctx, args.checkpoint)
    if errors:
        _err(f"{args.checkpoint}: {len(errors)} setting(s) could not be restored:")
        for line in errors:
            _err(f"  - {line}")
        return EXIT_DEVICE
    print(f"{args.checkpoint}: all {count} setting(s) are at their original values")
    return EXIT_OK


@_nvml_errors
def cmd_status(args: argparse.Namespace) -> int:
    from energyopt.nvml.measure import format_status, gpu_status
    from energyopt.nvml.session import open_session

    with open_session() as session:
        nvml = session.ctx.nvml
        rows = [gpu_status(nvml, i) for i in range(nvml.device_count())]
    print("\n".join(format_status(rows)))
    return EXIT_OK


@_nvml_errors
def cmd_measure(args: argparse.Namespace) -> int:
    from energyopt.nvml.measure import format_windows, measure
    from energyopt.nvml.session import open_session

    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    with open_session() as session:
        clock = session.command_clock if command else session.clock
        windows, rc = measure(session.ctx.nvml, clock, args.seconds, command, args.interval)
    print("\n".join(format_windows(windows)))
    if command and rc != 0:
        _err(f"command exited with status {rc}")
    return rc


def cmd_compile(args: argparse.Namespace) -> int:
    from energyopt.tables import compile_table

    say = _progress(args.quiet)
    say(f"compiling {args.spec} into {args.output} with {args.workers} worker(s)")
    kind = compile_table(
        args.spec, args.output, workers=args.workers, say=say, scheduler=args.scheduler
    )
    print(f"{kind} table written to {args.output}")
    return EXIT_OK


def _key_value(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise SpecError([f"lookup: {text!r}: expected KEY=VALUE"])
    return name, value


def cmd_lookup(args: argparse.Namespace) -> int:
    import math

    from energyopt.tables import Table

    table = Table.open(args.file)
    key: dict[str, str | float] = {}
    for name, value in (_key_value(k) for k in args.keys):
        axis = table.axes.get(name)
        if axis is None or axis.kind == "category":
            key[name] = value
            continue
        try:
            key[name] = float(value)
        except ValueError:
            raise SpecError([f"lookup: {name}={value!r}: expected a number"]) from None
    out = table.lookup(**key)
    for name, value in out.items():
        shown = "nan" if isinstance(value, float) and math.isnan(value) else value
        print(f"{name} = {shown}")
    if len(out) == 1:
        _err(f"{args.file}: no column is keyed by only {', '.join(key) or 'nothing'}")
        return EXIT_BAD_INPUT
    if not out["in_grid"]:
        _err(f"{args.file}: key outside the grid: fallback values (no decision)")
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    from energyopt.tables import Table

    print("\n".join(Table.open(args.file).describe()))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="energyopt",
        description="Energy-optimal placement, SM partitioning and clocks for GPU fleets.",
    )
    parser.add_argument("--version", action="version", version=f"energyopt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("schema", help="print the JSON Schema of a file kind")
    p.add_argument(
        "kind", nargs="?", default="instance", choices=["instance", "plan", "gpu", "model"]
    )
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser("validate", help="check instance files")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("show", help="print an instance and its operating points")
    p.add_argument("file")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("solve", help="find the minimum-energy plan of an instance")
    p.add_argument("file")
    p.add_argument("--solver", default="highs-exact", help="preset name or TOML file")
    p.add_argument("--time-limit", type=float, default=None, help="seconds")
    p.add_argument("--gap", type=float, default=None, help="relative gap to stop at, e.g. 0.005")
    p.add_argument("-o", "--output", help="write the plan (JSON, YAML or TOML by suffix)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_solve)

    p = sub.add_parser("verify", help="check a plan against an instance")
    p.add_argument("instance")
    p.add_argument("plan")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("catalog", help="list the embedded GPU types and models")
    p.set_defaults(func=cmd_catalog)

    p = sub.add_parser("solvers", help="list the solver presets")
    p.set_defaults(func=cmd_solvers)
    p = sub.add_parser("apply", help="put a plan on this host's GPUs (dry run unless --apply)")
    p.add_argument("plan", help="plan file (JSON, YAML or TOML)")
    p.add_argument("--apply", action="store_true", help="make the changes (default: dry run)")
    p.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="PLAN_GPU=INDEX|UUID",
        help="put a plan GPU on a device (repeatable); only mapped plan GPUs are applied",
    )
    p.add_argument("--map-file", help="YAML/JSON/TOML table {plan_gpu: index or uuid}")
    p.add_argument(
        "--checkpoint", help="checkpoint file (default energyopt-checkpoint-DATE-TIME.json)"
    )
    p.add_argument("--mig-config", metavar="FILE", help="write the MIG layout for mig-parted")
    p.add_argument("--mig-config-name", help="config name in that file (default: plan instance)")
    p.add_argument(
        "--mps-dir", default="/tmp/energyopt-mps", help="base of the per-GPU MPS directories"
    )
    p.add_argument("--catalog", action="append", default=[], metavar="FILE")
    p.set_defaults(func=cmd_apply)

    p = sub.add_parser("restore", help="put back every setting saved in an apply checkpoint")
    p.add_argument("checkpoint")
    p.set_defaults(func=cmd_restore)

    p = sub.add_parser("status", help="clocks, power, limits and energy counter per GPU")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "measure", help="energy, average power and clocks per GPU over a window or a command"
    )
    p.add_argument("--seconds", type=float, default=None, help="window length (s)")
    p.add_argument("--interval", type=float, default=0.1, help="sampling interval (s)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...] to measure")
    p.set_defaults(func=cmd_measure)
    p = sub.add_parser("compile", help="compile a lookup table from a compile spec")
    p.add_argument("spec", help="compile spec (YAML, JSON or TOML)")
    p.add_argument("-o", "--output", required=True, help="table file to write")
    p.add_argument("--workers", type=int, default=1, help="local solver processes")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="solve cells on a Dask distributed cluster (needs energyopt[dask])",
    )
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("lookup", help="look a key up in a table file")
    p.add_argument("file")
    p.add_argument("keys", nargs="*", metavar="KEY=VALUE")
    p.set_defaults(func=cmd_lookup)

    p = sub.add_parser("inspect", help="header, axes, sizes and checksum of a table file")
    p.add_argument("file")
    p.set_defaults(func=cmd_inspect)
    p = sub.add_parser("evaluate", help="simulate planners on a trace or synthetic load")
    importlib.import_module("energyopt.cli_evaluate").configure(p)
    for name in ("validate", "show", "solve", "verify"):
        sub.choices[name].add_argument(
            "--catalog",
            action="append",
            default=[],
            metavar="FILE",
            help="extra catalog file (gpus:/models: lists); overrides entries by name",
        )
    for name in ("validate", "show", "solve", "verify", "compile", "evaluate"):
        sub.choices[name].add_argument(
            "--limit",
            action="append",
            default=[],
            metavar="NAME=N",
            help="raise a size limit a file is held to (names and defaults: docs/limits.md)",
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from energyopt.spec.limits import Limits, parse_limit_options, using

    args = build_parser().parse_args(argv)
    try:
        limits = parse_limit_options(getattr(args, "limit", []), Limits())
        with using(limits):
            return int(args.func(args))
    except SpecError as exc:
        for line in exc.problems:
            _err(line)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`, which closed early
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as exc:
        _err(f"energyopt: internal error: {type(exc).__name__}: {exc}")
        _err("please report it with the input file")
        return EXIT_INTERNAL


if __name__ == "__main__":
    raise SystemExit(main())
