"""Verbs on lookup tables: compile, lookup, inspect."""

from __future__ import annotations

import argparse
from typing import Any

from energyopt.cli.common import EXIT_BAD_INPUT, EXIT_OK, err, output_path, progress
from energyopt.spec.errors import SpecError


def cmd_compile(args: argparse.Namespace) -> int:
    from energyopt.cli.documents import expect_document
    from energyopt.families.serving.tables import compile_table

    output_path(args.output)  # `-o ''` is named before the compile, not after
    expect_document(args.spec, ("plans", "oppoints"), "compile")
    say = progress(args.quiet)
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
    out = table.lookup_once(**key)  # one key: nothing to compile or cache
    for name, value in out.items():
        shown = "nan" if isinstance(value, float) and math.isnan(value) else value
        print(f"{name} = {shown}")
    if len(out) == 1:
        err(f"{args.file}: no column is keyed by only {', '.join(key) or 'nothing'}")
        return EXIT_BAD_INPUT
    if not out["in_grid"]:
        err(f"{args.file}: key outside the grid: fallback values (no decision)")
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    from energyopt.tables import Table

    print("\n".join(Table.open(args.file).describe()))
    return EXIT_OK


def configure(sub: Any) -> None:
    """Add these verbs to the ``energyopt`` subcommands."""
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
