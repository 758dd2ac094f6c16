"""CPU time of starting the ``energyopt`` command, against a bare interpreter.

    python benchmarks/cli_startup.py [--repeats 5] [--table OPS.eot]

Runs each command as a child process, ``--repeats`` rounds of all commands in turn
(so a busy moment of a shared machine falls on every command alike), and takes the
best round of each: the CPU time is the user + system time of the child
(``resource.getrusage(RUSAGE_CHILDREN)`` before and after it), in seconds. The
``lookup`` reads the operating-point table of the quickstart fleet (docs/tables.md's
example key), compiled once beforehand into a temporary folder unless ``--table``
names one. Targets: ``energyopt --version`` under 0.3 s and one ``lookup`` under
0.5 s of CPU. Exit status 1 when a target is missed or a command fails.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPS_SPEC = ROOT / "instances" / "compile-quickstart-oppoints.yaml"
LOOKUP_KEY = ("workload=chat-llama", "gpu_type=H100-SXM5-80GB", "load=7.5")
"""The key of docs/tables.md's ``energyopt lookup`` example."""


@dataclass(frozen=True)
class Command:
    """One measured command: its label, argv, CPU target (s; None: none) and a text
    its standard output must hold (so a failing command is not timed as a quick one)."""

    label: str
    argv: list[str]
    target_s: float | None
    expect: str


def energyopt_argv() -> list[str]:
    """The installed ``energyopt`` script (as users run it), else ``python -m energyopt``."""
    script = Path(sys.executable).parent / "energyopt"
    if script.is_file():
        return [str(script)]
    found = shutil.which("energyopt")
    return [found] if found else [sys.executable, "-m", "energyopt"]


def child_cpu_s(argv: list[str], expect: str) -> float:
    """User + system CPU seconds of one run of ``argv``; RuntimeError when it fails
    or its output lacks ``expect``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=ROOT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or expect not in done.stdout:
        raise RuntimeError(
            f"{' '.join(argv)}: exit {done.returncode}, output {done.stdout[-300:]!r} "
            f"{done.stderr[-300:]!r}"
        )
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def compile_table(folder: Path) -> Path:
    """The quickstart operating-point table, compiled into ``folder`` (not timed)."""
    table = folder / "quickstart-ops.eot"
    subprocess.run(
        [*energyopt_argv(), "compile", str(OPS_SPEC), "-o", str(table), "-q"],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    return table


def commands(table: Path) -> list[Command]:
    """The measured commands, the bare interpreter first (the ratios' base)."""
    cli = energyopt_argv()
    py = sys.executable
    return [
        Command("python -c pass", [py, "-c", "pass"], None, ""),
        Command('python -c "import energyopt"', [py, "-c", "import energyopt"], None, ""),
        Command("energyopt --version", [*cli, "--version"], 0.3, "energyopt "),
        Command("energyopt --help", [*cli, "--help"], None, "exit status:"),
        Command(
            f"energyopt lookup OPS.eot {' '.join(LOOKUP_KEY)}",
            [*cli, "lookup", str(table), *LOOKUP_KEY],
            0.5,
            "in_grid = True",
        ),
    ]


def measure(cmds: list[Command], repeats: int) -> list[float]:
    """Best-of-``repeats`` CPU seconds of each command, rounds interleaved."""
    best = [float("inf")] * len(cmds)
    for _ in range(repeats):
        for i, cmd in enumerate(cmds):
            best[i] = min(best[i], child_cpu_s(cmd.argv, cmd.expect))
    return best


def table_lines(cmds: list[Command], cpu: list[float]) -> tuple[list[str], bool]:
    """The printed table and whether every target is met."""
    base = cpu[0]
    width = max(len(c.label) for c in cmds)
    lines = [f"{'command':<{width}}  {'CPU s':>6}  {'ratio':>6}  {'target':>7}  met"]
    all_met = True
    for cmd, seconds in zip(cmds, cpu, strict=True):
        ratio = f"{seconds / base:6.1f}" if base > 0 else "     -"
        if cmd.target_s is None:
            target, met = "-", "-"
        else:
            ok = seconds < cmd.target_s
            all_met = all_met and ok
            target, met = f"< {cmd.target_s:g}", "yes" if ok else "NO"
        lines.append(f"{cmd.label:<{width}}  {seconds:6.3f}  {ratio}  {target:>7}  {met}")
    return lines, all_met


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="rounds; the best counts")
    parser.add_argument("--table", type=Path, default=None, help="table to look up in")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats: at least 1")
    with tempfile.TemporaryDirectory(prefix="cli-startup-") as tmp:
        table = args.table if args.table is not None else compile_table(Path(tmp))
        cmds = commands(table)
        cpu = measure(cmds, args.repeats)
    lines, all_met = table_lines(cmds, cpu)
    print(
        f"CPU time (user + sys) of each command, best of {args.repeats}; "
        f"ratio to `python -c pass` ({sys.executable})"
    )
    print("\n".join(lines))
    print("every target met" if all_met else "a target is missed")
    return 0 if all_met else 1


if __name__ == "__main__":
    raise SystemExit(main())
