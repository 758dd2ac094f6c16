"""PNG plots of an evaluation (matplotlib, the ``[plot]`` extra)."""

from __future__ import annotations

import importlib
import io
from pathlib import Path
from typing import Any

from energyopt.sim.loop import EvaluationResult
from energyopt.spec.io import write_bytes_atomic

PLOT_HINT = "plots need matplotlib: pip install 'energyopt[plot]'"


def _pyplot() -> Any | None:
    try:
        mpl: Any = importlib.import_module("matplotlib")
    except ImportError:
        return None
    mpl.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def write_plots(res: EvaluationResult, folder: Path) -> list[Path] | None:
    """power.png (fleet power and GPUs on over time per planner) and slo.png (attainment per
    planner and workload); None when matplotlib is missing."""
    plt = _pyplot()
    if plt is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    bin_s = res.evaluation.power_bin_s
    window = res.evaluation.duration_s
    fig, (ax, ax_on) = plt.subplots(
        2, 1, figsize=(10, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    for run in res.runs:
        series = run.result.power_w
        n = min(len(series), int(window / bin_s + 0.999))
        minutes = [(k + 0.5) * bin_s / 60 for k in range(n)]
        ax.plot(minutes, [p / 1e3 for p in series[:n]], label=run.name, linewidth=1.2)
        steps = [(t, c) for t, c in run.result.gpus_on if t <= window]
        times = [t / 60 for t, _ in steps] + [window / 60]
        counts = [c for _, c in steps] + [steps[-1][1] if steps else 0]
        ax_on.step(times, counts, where="post", linewidth=1.2)
    ax.set_ylabel(f"fleet power (kW, {bin_s:g} s mean)")
    ax.set_title(f"{res.evaluation.name}: power and GPUs on over time")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax_on.set_xlabel("time (min)")
    ax_on.set_ylabel("GPUs on")
    ax_on.grid(alpha=0.3)
    fig.tight_layout()
    power = folder / "power.png"
    _save(fig, power)
    plt.close(fig)

    names = [s.name for s in res.runs[0].result.stats] if res.runs else []
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / max(len(res.runs), 1)
    for k, run in enumerate(res.runs):
        xs = [i + k * width for i in range(len(names) + 1)]
        fleet = run.result.attainment[2]
        values = [s.slo_attainment * 100 for s in run.result.stats] + [fleet * 100]
        ax.bar(xs, values, width=width, label=run.name)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names) + 1)])
    ax.set_xticklabels([*names, "all"], rotation=20, fontsize=8)
    ax.set_ylabel("SLO attainment (% of requests)")
    ax.set_ylim(0, 105)
    ax.set_title(f"{res.evaluation.name}: SLO attainment per planner")
    ax.legend(fontsize=8, ncol=min(len(res.runs), 6), loc="lower center")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    slo = folder / "slo.png"
    _save(fig, slo)
    plt.close(fig)
    return [power, slo]


def _save(fig: Any, path: Path) -> None:
    """Save ``fig`` as a PNG at ``path`` by way of a temporary file and a rename."""
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=120, format="png")
    write_bytes_atomic(path, buffer.getvalue())
