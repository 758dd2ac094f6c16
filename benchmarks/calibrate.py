"""Fit the performance model's constants to the shared measured tables and print errors.

Usage: python benchmarks/calibrate.py [--data ../shared/data]

Prints, per calibrated GPU, the fitted `efficiency` and `power` blocks (to put in
models/gpus/*.yaml) and the error of the model on each table before and after.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from energyopt.catalog import builtin_catalog
from energyopt.perf.fitting import Tables, fit_gpu, latency_errors, power_errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    default = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    parser.add_argument("--data", type=Path, default=default)
    args = parser.parse_args()
    tables = Tables(args.data)
    catalog = builtin_catalog()
    for name in ("A100-SXM4-80GB", "H100-SXM5-80GB"):
        gpu = catalog.gpu(name)
        print(f"== {name}: current catalog values")
        for s in latency_errors(catalog, tables, gpu) + power_errors(catalog, tables, gpu):
            print("  " + s.line())
        fitted = fit_gpu(catalog, tables, name)
        print(f"== {name}: fitted")
        print(
            yaml.safe_dump(
                {"efficiency": fitted.efficiency.model_dump(), "power": fitted.power.model_dump()},
                sort_keys=False,
            )
        )
        for s in latency_errors(catalog, tables, fitted) + power_errors(catalog, tables, fitted):
            print("  " + s.line())


if __name__ == "__main__":
    main()
