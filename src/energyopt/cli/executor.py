"""Verbs that touch this host's GPUs through NVML: apply, restore, status, measure."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from energyopt.cli.common import EXIT_BAD_INPUT, EXIT_DEVICE, EXIT_OK, EXIT_SIGNAL, err
from energyopt.spec.errors import SpecError

if TYPE_CHECKING:
    from energyopt.catalog.loader import Catalog
    from energyopt.spec.plan import Plan


def nvml_errors(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Executor errors become a message and exit status 5 (130 if interrupted; 2 for a
    checkpoint file that is missing or malformed, which is bad input)."""

    def run(args: argparse.Namespace) -> int:
        from energyopt.nvml.errors import ApplyInterrupted, BadCheckpoint, ExecutorError

        try:
            return fn(args)
        except ExecutorError as exc:
            err(f"energyopt {args.command}: {exc}")
            if isinstance(exc, BadCheckpoint):
                return EXIT_BAD_INPUT
            return EXIT_SIGNAL if isinstance(exc, ApplyInterrupted) else EXIT_DEVICE

    return run


def nvml_catalog(files: list[str]) -> Catalog:
    from energyopt.catalog.loader import bind_catalog

    catalog, problems = bind_catalog(extra=files)
    if problems:
        raise SpecError(problems)
    return catalog


def _say_where(where: str) -> None:
    """Name the simulated host's state file (stderr; real NVML says nothing)."""
    if where.startswith("simulated"):
        err(where)


def _serving_plan(path: str) -> Plan:
    """The serving plan in ``path``; a plan of another family, or a file with no ``gpus``,
    is refused naming the plans ``apply`` takes instead of listing every field."""
    from pydantic import ValidationError

    from energyopt.families import families
    from energyopt.spec.io import parse, read_data
    from energyopt.spec.plan import Plan

    data = read_data(path)
    try:
        return parse(Plan, data, path)
    except SpecError:
        takes = (
            "`energyopt apply` takes serving plans (per-GPU clocks, power limits and "
            "MPS/MIG placements, from `energyopt solve` on a serving instance)"
        )
        for fam in families():
            if fam.kind == "serving":
                continue
            try:
                fam.plan_model.model_validate(data)
            except ValidationError:
                continue
            raise SpecError(
                [f"{path}: this is a {fam.kind} plan; {takes}: it has no GPU settings to apply"]
            ) from None
        if "gpus" not in data:
            raise SpecError([f"{path}: gpus: missing; {takes}"]) from None
        raise


@nvml_errors
def cmd_apply(args: argparse.Namespace) -> int:
    from energyopt.nvml.errors import DeviceMapError, ExecutorError
    from energyopt.nvml.planner import (
        mig_parted_yaml,
        parse_map_options,
        plan_actions,
        read_map_file,
    )
    from energyopt.nvml.session import open_session
    from energyopt.nvml.transaction import Transaction
    from energyopt.spec.checks import plan_problems
    from energyopt.spec.io import write_text_atomic

    plan = _serving_plan(args.plan)
    catalog = nvml_catalog(args.catalog)
    problems = plan_problems(plan, catalog.gpus, args.plan)
    if problems:
        raise SpecError(problems)
    plan_gpus = [g.gpu for g in plan.gpus]
    mapping = read_map_file(args.map_file, plan_gpus) if args.map_file else {}
    origins = {gpu: f"{args.map_file}: {gpu}" for gpu in mapping}
    try:
        options = parse_map_options(args.map)
    except DeviceMapError as exc:
        raise SpecError([str(exc)]) from None  # a malformed option is bad input
    strangers = [gpu for gpu in options if gpu not in plan_gpus]
    if strangers:
        raise SpecError(
            [f"--map {gpu}={options[gpu]}: {gpu} is not a GPU of {args.plan}" for gpu in strangers]
        )
    mapping.update(options)
    origins.update({gpu: f"--map {gpu}={dev}" for gpu, dev in options.items()})
    with open_session() as session:
        ctx = session.ctx
        host = plan_actions(plan, ctx.nvml, catalog, mapping or None, args.mps_dir, origins)
        originals = [a.read(ctx) for a in host.actions]
        verb = "applying" if args.apply else "dry run (nothing is changed; add --apply)"
        print(f"{verb}: {args.plan} on the {ctx.nvml.kind} backend")
        _say_where(session.where)
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


@nvml_errors
def cmd_restore(args: argparse.Namespace) -> int:
    from energyopt.nvml.errors import CheckpointError
    from energyopt.nvml.session import open_session
    from energyopt.nvml.transaction import read_checkpoint, restore

    read_checkpoint(args.checkpoint)  # a missing or foreign file is named before NVML starts
    with open_session() as session:
        _say_where(session.where)
        if session.fresh:
            # every setting of a new simulated host is at its default: "restored" would
            # be a claim about an apply this host never saw
            raise CheckpointError(
                f"{args.checkpoint}: the simulated host has no saved state at "
                f"{session.sim_state}, so it never saw the apply this checkpoint undoes; "
                "set ENERGYOPT_NVML_SIM_STATE to the state file that apply used"
            )
        count, errors = restore(session.ctx, args.checkpoint)
    if errors:
        err(f"{args.checkpoint}: {len(errors)} setting(s) could not be restored:")
        for line in errors:
            err(f"  - {line}")
        return EXIT_DEVICE
    print(f"{args.checkpoint}: all {count} setting(s) are at their original values")
    return EXIT_OK


@nvml_errors
def cmd_status(args: argparse.Namespace) -> int:
    from energyopt.nvml.measure import format_status, gpu_status
    from energyopt.nvml.session import open_session

    with open_session() as session:
        _say_where(session.where)
        nvml = session.ctx.nvml
        rows = [gpu_status(nvml, i) for i in range(nvml.device_count())]
    print("\n".join(format_status(rows)))
    return EXIT_OK


@nvml_errors
def cmd_measure(args: argparse.Namespace) -> int:
    from energyopt.nvml.measure import format_windows, measure
    from energyopt.nvml.session import open_session

    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    with open_session() as session:
        _say_where(session.where)
        clock = session.command_clock if command else session.clock
        windows, rc = measure(session.ctx.nvml, clock, args.seconds, command, args.interval)
    print("\n".join(format_windows(windows)))
    if command and rc != 0:
        err(f"command exited with status {rc}")
    return rc


def configure(sub: Any) -> None:
    """Add these verbs to the ``energyopt`` subcommands."""
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
