"""Fit the collective cost model's link constants to the measured collective times.

Coordinate search over launch_us, nvlink_gbs, reduce_gbs, network_gbs and network_us
(per GPU type) minimising the mean over tables of the median absolute percentage
error of the cost model's time of NCCL's choice (families/collective/formulations/calibration.py).
Prints the fitted constants (to copy into families/collective/formulations/constants.py) and
the error per table. Usage: python benchmarks/collective_calibrate.py [--every K]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from energyopt.families.collective.formulations.calibration import (
    Point,
    errors,
    nccl_tests_points,
    vidur_points,
)
from energyopt.families.collective.formulations.constants import defaults_for

SHARED = Path(__file__).resolve().parents[1] / "data"  # data/README.md
STEPS = (0.7, 0.85, 1.15, 1.4)


def overrides(v: dict[str, float], gpu: str) -> dict[str, object]:
    """Topology fields that set the model's constants to ``v``."""
    cal = defaults_for(gpu)
    assert cal is not None
    return {
        "nvlink": {"bandwidth_gbs": v["nvlink_gbs"], "latency_us": cal.nvlink_us},
        "network": {"bandwidth_gbs": v["network_gbs"], "latency_us": v["network_us"]},
        "launch_us": v["launch_us"],
        "reduce_gbs": v["reduce_gbs"],
        "channel_gbs": cal.channel_gbs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--every", type=int, default=40, help="use every K-th message size")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    for gpu in ("H100-SXM5-80GB", "A100-SXM4-80GB"):
        pts = list(vidur_points(SHARED, gpu, args.every))
        if gpu.startswith("H100"):
            pts += list(nccl_tests_points(SHARED, max(1, args.every // 8)))
        cal = defaults_for(gpu)
        assert cal is not None
        x = {
            "launch_us": cal.launch_us,
            "nvlink_gbs": cal.nvlink_gbs,
            "reduce_gbs": cal.reduce_gbs,
            "network_gbs": cal.network_gbs,
            "network_us": cal.network_us,
        }

        def loss(v: dict[str, float], pts: list[Point] = pts, gpu: str = gpu) -> float:
            return float(np.mean([e.median_ape for e in errors(pts, gpu, overrides(v, gpu))]))

        best = loss(x)
        for _ in range(args.rounds):
            for k in list(x):
                for s in STEPS:
                    y = dict(x)
                    y[k] = round(x[k] * s, 2)
                    f = loss(y)
                    if f < best:
                        best, x = f, y
        print(
            f"{gpu}: mean median APE {100 * best:.1f} %: "
            + ", ".join(f"{k}={v:g}" for k, v in x.items())
        )
        for e in errors(pts, gpu, overrides(x, gpu)):
            print("  " + e.line())


if __name__ == "__main__":
    main()
