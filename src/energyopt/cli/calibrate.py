"""``energyopt calibrate``: fit a GPU type's clock constants on a measured sweep and
write a catalog file that other commands take with ``--catalog``."""

from __future__ import annotations

import argparse

from energyopt.cli.common import EXIT_OK, err, output_path
from energyopt.spec.errors import SpecError


def configure(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``calibrate`` verb."""
    p = sub.add_parser(
        "calibrate",
        help="fit a GPU type's clock constants on a clock sweep CSV (energyopt profile)",
        description="Fit compute_clock_fixed, voltage_floor and knee_fraction of a GPU type "
        "on MEASUREMENTS.csv (kernel,clock_mhz,flops,bytes,seconds,energy_j; written by "
        "energyopt profile) and write a catalog file with the fitted entry "
        "(docs/performance-model.md, section 8).",
    )
    p.add_argument("measurements", metavar="MEASUREMENTS.csv")
    p.add_argument("--gpu", required=True, metavar="TYPE", help="catalog GPU type measured")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="catalog.yaml",
        help="catalog file to write, YAML, JSON or TOML by its suffix",
    )
    p.add_argument(
        "--catalog",
        action="append",
        default=[],
        metavar="FILE",
        help="extra catalog file holding TYPE (gpus:/models: lists)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Read the sweep, fit, print the errors before and after, write the catalog."""
    from energyopt.catalog.loader import bind_catalog
    from energyopt.perf.clockfit import (
        catalog_entry,
        fit_at_bounds,
        fit_clock_constants,
        ratio_errors,
        read_sweep,
    )
    from energyopt.spec.io import dump_data, file_format

    output = output_path(args.output)
    file_format(output)  # the catalog is written in the format its suffix names
    catalog, problems = bind_catalog(extra=args.catalog)
    if problems:
        raise SpecError(problems)
    if args.gpu not in catalog.gpus:
        raise SpecError(
            [f"--gpu: unknown GPU type {args.gpu!r} (known: {', '.join(sorted(catalog.gpus))})"]
        )
    gpu = catalog.gpus[args.gpu]
    sweeps = read_sweep(args.measurements, gpu)
    fitted = fit_clock_constants(gpu, sweeps)
    before = ratio_errors(gpu, sweeps)
    after = ratio_errors(fitted, sweeps)
    runs = sum(len(s.clock_mhz) for s in sweeps)
    print(f"{args.gpu}: {runs} runs of {len(sweeps)} kernel(s) from {args.measurements}")
    print(f"{'constant':32s} {'catalog':>8s} {'fitted':>8s}")
    for label, old, new in (
        (
            "efficiency.compute_clock_fixed",
            gpu.efficiency.compute_clock_fixed,
            fitted.efficiency.compute_clock_fixed,
        ),
        ("power.voltage_floor", gpu.power.voltage_floor, fitted.power.voltage_floor),
        ("power.knee_fraction", gpu.power.knee_fraction, fitted.power.knee_fraction),
    ):
        print(f"{label:32s} {old:8.4f} {new:8.4f}")
    print("median error of the ratios to the highest clock (time / power / energy):")
    for label, e in (("catalog", before), ("fitted", after)):
        print(f"  {label:8s} {e['time']:5.1f} / {e['power']:5.1f} / {e['energy']:5.1f} %")
    stuck = fit_at_bounds(fitted)
    if stuck:
        raise SpecError(
            [
                f"{args.measurements}: the fit ended on the bound of its search for "
                f"{'; '.join(stuck)}: the sweep does not determine it; check the "
                f"measurements (nothing written to {args.output})"
            ]
        )
    dump_data(catalog_entry(fitted, str(args.measurements), runs), output)
    err(f"wrote {args.output}; use it with --catalog {args.output}")
    return EXIT_OK
