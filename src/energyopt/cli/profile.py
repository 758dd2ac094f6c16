"""``energyopt profile``: the clock sweep of one GPU, as the CSV ``energyopt calibrate``
fits (src/energyopt/nvml/profile.py)."""

from __future__ import annotations

import argparse

from energyopt.cli.common import EXIT_DEVICE, EXIT_OK, EXIT_SIGNAL, err, output_path, progress


def configure(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``profile`` verb."""
    p = sub.add_parser(
        "profile",
        help="measure time and energy of fixed kernels at locked SM clocks (CSV for calibrate)",
        description="Lock each of --clocks SM clocks of GPU --gpu in turn (highest first), run a "
        "bf16 matmul and a memory copy of about --seconds each, read the NVML energy counter "
        "around every run, restore the clocks, and write MEASUREMENTS.csv for energyopt "
        "calibrate. Needs PyTorch with CUDA and the rights to lock clocks; with "
        "ENERGYOPT_NVML_BACKEND=sim it runs on the simulated NVML.",
    )
    p.add_argument("-o", "--output", required=True, metavar="MEASUREMENTS.csv")
    p.add_argument("--gpu", type=int, default=0, metavar="INDEX", help="NVML index (default 0)")
    p.add_argument("--clocks", type=int, default=12, help="clocks in the sweep (default 12)")
    p.add_argument("--seconds", type=float, default=2.0, help="about this long per run (s)")
    p.add_argument("--repeats", type=int, default=1, help="runs per kernel and clock")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Sweep, restore, write the CSV."""
    from energyopt.nvml.errors import ExecutorError
    from energyopt.nvml.profile import (
        SimRunner,
        TorchRunner,
        kernels_for,
        run_sweep,
        sweep_clocks,
        write_csv,
    )
    from energyopt.nvml.session import open_session
    from energyopt.nvml.sim import SimulatedNvml

    output_path(args.output)  # before the sweep: `-o ''` or a folder is refused now
    if args.clocks < 3 or args.repeats < 1 or not 0 < args.seconds <= 60:
        err("energyopt profile: need --clocks >= 3, --repeats >= 1 and 0 < --seconds <= 60")
        return 2
    say = progress(args.quiet)
    try:
        with open_session() as session:
            nvml = session.ctx.nvml
            if not 0 <= args.gpu < nvml.device_count():
                err(f"energyopt profile: no GPU {args.gpu} (this host has {nvml.device_count()})")
                return EXIT_DEVICE
            runner: SimRunner | TorchRunner
            if isinstance(nvml, SimulatedNvml):
                runner = SimRunner(nvml, args.gpu)
                gpu = nvml.gpu_type(args.gpu)
            else:
                from energyopt.catalog import builtin_catalog
                from energyopt.nvml.names import name_matches

                matches = [
                    g
                    for g in builtin_catalog().gpus.values()
                    if name_matches(g.name, nvml.name(args.gpu))
                ]
                if not matches:
                    err(f"energyopt profile: {nvml.name(args.gpu)} is not a catalog GPU type")
                    return EXIT_DEVICE
                gpu = matches[0]
                try:
                    runner = TorchRunner(args.gpu)
                except (ImportError, RuntimeError) as exc:
                    err(f"energyopt profile: needs PyTorch with CUDA: {exc}")
                    return EXIT_DEVICE
            clocks = sweep_clocks(nvml.supported_sm_clocks(args.gpu), args.clocks)
            kernels = kernels_for(gpu, args.seconds)
            say(f"GPU {args.gpu} ({gpu.name}): {len(clocks)} clocks {clocks[0]}..{clocks[-1]} MHz")
            rows = run_sweep(nvml, args.gpu, runner, kernels, clocks, args.repeats, say)
    except ExecutorError as exc:
        err(f"energyopt profile: {exc}")
        return EXIT_DEVICE
    except KeyboardInterrupt:
        err("energyopt profile: interrupted; clocks restored")
        return EXIT_SIGNAL
    write_csv(rows, args.output)
    print(
        f"wrote {args.output}: {len(rows)} runs of {len(kernels)} kernels at {len(clocks)} clocks"
    )
    print(f"fit it with: energyopt calibrate {args.output} --gpu {gpu.name} -o catalog.yaml")
    return EXIT_OK
