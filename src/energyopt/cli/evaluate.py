"""``energyopt evaluate SPEC``: replay a load against planners in the simulator and
print energy, saving and SLO attainment side by side (docs/evaluation.md)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def configure(p: argparse.ArgumentParser) -> None:
    """Arguments of the ``evaluate`` subcommand."""
    p.add_argument("spec", help="evaluation spec (kind: evaluate; YAML, JSON or TOML)")
    p.add_argument("-o", "--output-dir", default=None, help="plots and CSV (default: the spec's)")
    p.add_argument(
        "--planner",
        action="append",
        default=None,
        metavar="NAME",
        help="run only this planner of the spec (repeatable)",
    )
    p.add_argument("--duration", type=float, default=None, help="override duration_s (s)")
    p.add_argument("--no-plots", action="store_true", help="write CSV only")
    p.add_argument(
        "--yardstick",
        action="store_true",
        help="also run the clairvoyant yardstick: energyopt re-planned every 30 s at each "
        "window's true arrival rates, replayed on the same requests",
    )
    p.add_argument(
        "--covering-yardstick",
        action="store_true",
        help="also run the covering yardstick: energyopt+online's planner and online "
        "control re-planned every 30 s for the true peak 10-s rate until the next plan "
        "serves, replayed on the same requests (docs/evaluation.md)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--catalog", action="append", default=[], metavar="FILE")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the evaluation; exit 0, or 2 on bad input (SpecError, handled by main)."""
    from energyopt.cli.common import EXIT_OK, progress
    from energyopt.cli.documents import expect_document, validate_evaluation
    from energyopt.families.serving.loop import (
        CLAIRVOYANT,
        CLAIRVOYANT_ONLINE,
        PlannerRun,
        PlanningError,
        evaluate,
        run_clairvoyant,
        run_covering_clairvoyant,
    )
    from energyopt.families.serving.loop_report import format_table, write_csvs
    from energyopt.families.serving.plots import PLOT_HINT, write_plots
    from energyopt.spec.errors import SpecError
    from energyopt.spec.evaluation import PlannerSpec, load_evaluation

    expect_document(args.spec, ("evaluate",), "evaluate")
    if args.output_dir is not None and not args.output_dir.strip():
        # as every other -o: an empty name is a mistake, not "the default folder"
        raise SpecError(["-o: empty folder name; give the folder to write, or leave -o out"])
    validate_evaluation(args.spec, args.catalog)  # refuse what validate refuses, before any work
    ev = load_evaluation(args.spec)
    if args.duration is not None:
        if args.duration <= 0:
            raise SpecError([f"--duration: must be positive, got {args.duration:g}"])
        ev = ev.model_copy(update={"duration_s": args.duration})
    Runner = Callable[..., PlannerRun]
    yardsticks: list[tuple[PlannerSpec, Runner, str]] = [
        *([(CLAIRVOYANT, run_clairvoyant, "the yardstick")] if args.yardstick else []),
        *(
            [(CLAIRVOYANT_ONLINE, run_covering_clairvoyant, "the covering yardstick")]
            if args.covering_yardstick
            else []
        ),
    ]
    for yard, _, _ in yardsticks:
        if any(p.name == yard.name for p in ev.planners):
            raise SpecError(
                [f"{args.spec}: planners: a planner is named {yard.name}, the yardstick's name"]
            )
    say = progress(args.quiet)
    say(f"evaluating {args.spec}")
    res = evaluate(ev, args.spec, only=args.planner, say=say, catalogs=args.catalog)
    for yard, runner, what in yardsticks:
        say(f"{yard.name}: simulating ({what})")
        try:
            res.runs.append(runner(res, say=say))
        except PlanningError as exc:
            res.failed.append(str(exc))
    folder = Path(args.output_dir if args.output_dir is not None else ev.output_dir)
    written = write_csvs(res, folder)  # files first: the table may go to a closed pipe
    plots = None if args.no_plots else write_plots(res, folder)
    print("\n".join(format_table(res)))
    if plots is None and not args.no_plots:
        print(PLOT_HINT)
    written += plots or []
    print(f"written: {', '.join(str(p) for p in written)}")
    return EXIT_OK
