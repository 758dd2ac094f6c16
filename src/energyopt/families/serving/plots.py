"""PNG plots of an evaluation (matplotlib, the ``[plot]`` extra).

``evaluation.png`` is the one figure that compares the planners: fleet power and GPUs
on over time, the energy each saves against the reference, and SLO attainment on an
axis zoomed to the differences, values labelled. ``power.png`` and ``slo.png`` are
larger views of the time series and of the attainment per workload. Every planner
keeps one colour, line style and marker across the panels, so lines that overlap
stay apart; lines that coincide are named in the legend ("= other planner") and in
a note in the panel. Legends sit outside the axes.
"""

from __future__ import annotations

import importlib
import io
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from energyopt.families.serving.loop import EvaluationResult, PlannerRun
from energyopt.spec.io import write_bytes_atomic

PLOT_HINT = "plots need matplotlib: pip install 'energyopt[plot]'"

COLOURS = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#7f7f7f",
    "#bcbd22",
)
LINE_STYLES: tuple[str | tuple[int, tuple[int, ...]], ...] = (
    "-",
    "--",
    "-.",
    ":",
    (0, (5, 1, 1, 1, 1, 1)),
    (0, (8, 2)),
    (0, (1, 3)),
    (0, (3, 1, 3, 3)),
)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<")
POWER_TOLERANCE_W = 1.0
"""Two planners' power series coincide when no bin differs by more than this (W)."""


@dataclass(frozen=True)
class Style:
    """How one planner is drawn in every panel."""

    colour: str
    line: str | tuple[int, tuple[int, ...]]
    marker: str


def styles(names: list[str]) -> dict[str, Style]:
    """One distinct (colour, line style, marker) per planner, in run order."""
    return {
        name: Style(
            COLOURS[k % len(COLOURS)], LINE_STYLES[k % len(LINE_STYLES)], MARKERS[k % len(MARKERS)]
        )
        for k, name in enumerate(names)
    }


def coinciding(series: dict[str, list[float]], tolerance: float) -> dict[str, str]:
    """Planner -> the first earlier planner whose series equals its own within
    ``tolerance`` in every point (series of different lengths never coincide)."""
    same: dict[str, str] = {}
    names = list(series)
    for k, name in enumerate(names):
        for first in names[:k]:
            if first in same:
                continue
            a, b = series[name], series[first]
            if len(a) == len(b) and all(abs(x - y) <= tolerance for x, y in zip(a, b, strict=True)):
                same[name] = first
                break
    return same


def zoomed_range(values: list[float], floor_span: float = 0.1) -> tuple[float, float]:
    """(low, high) of an axis that shows the differences between ``values`` (percent):
    from below the lowest (room for the labels, which sit left of each marker) to just
    above the highest, at least ``floor_span`` points wide, never past 100."""
    lo, hi = min(values), max(values)
    span = max(hi - lo, floor_span)
    return lo - 0.45 * span, min(hi + 0.08 * span, max(100.0, hi))


def _pyplot() -> Any | None:
    try:
        mpl: Any = importlib.import_module("matplotlib")
    except ImportError:
        return None
    mpl.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def _power_kw(run: PlannerRun, window_s: float) -> tuple[list[float], list[float]]:
    """(minutes at bin centres, mean fleet power in kW) inside the window."""
    bin_s = run.result.bin_s
    series = run.result.power_w
    n = min(len(series), int(window_s / bin_s + 0.999))
    return [(k + 0.5) * bin_s / 60 for k in range(n)], [p / 1e3 for p in series[:n]]


def _gpus_on(run: PlannerRun, window_s: float) -> tuple[list[float], list[float]]:
    """Step series (minutes, GPUs on) over the window."""
    steps = [(t, c) for t, c in run.result.gpus_on if t <= window_s]
    times = [t / 60 for t, _ in steps] + [window_s / 60]
    counts = [float(c) for _, c in steps] + [float(steps[-1][1]) if steps else 0.0]
    return times, counts


def _at(steps: tuple[list[float], list[float]], t: float) -> float:
    """Value of a post-step series at time ``t``."""
    times, values = steps
    value = values[0] if values else 0.0
    for time, v in zip(times, values, strict=True):
        if time > t:
            break
        value = v
    return value


def _label(name: str, same: dict[str, str]) -> str:
    return f"{name} (= {same[name]})" if name in same else name


def _note_same(ax: Any, same: dict[str, str], what: str, names: list[str]) -> None:
    """A note in the corner of ``ax`` naming the planners whose lines coincide."""
    if not same:
        return
    groups: dict[str, list[str]] = {}
    for name, first in same.items():
        groups.setdefault(first, [first]).append(name)
    parts = []
    for group in groups.values():
        rest = [n for n in names if n not in group]
        if len(group) > len(names) / 2:
            parts.append("every planner but " + ", ".join(rest) if rest else "every planner")
        else:
            parts.append(" = ".join(group))
    text = "\n".join(textwrap.wrap(f"same {what}: " + "; ".join(parts), 90))
    ax.text(
        0.01,
        0.98,
        text,
        transform=ax.transAxes,
        va="top",
        ha="left",
        fontsize=7,
        bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85, "edgecolor": "0.7"},
    )


def draw_power(ax: Any, res: EvaluationResult, look: dict[str, Style]) -> dict[str, str]:
    """Fleet power over time, one line per planner; the coinciding planners."""
    window = res.evaluation.duration_s
    series = {run.name: _power_kw(run, window) for run in res.runs}
    same = coinciding({n: [p * 1e3 for p in s[1]] for n, s in series.items()}, POWER_TOLERANCE_W)
    n_runs = max(len(res.runs), 1)
    for k, run in enumerate(res.runs):
        minutes, kw = series[run.name]
        every = max(len(minutes) // 10, n_runs)  # each planner marks different bins
        st = look[run.name]
        ax.plot(
            minutes,
            kw,
            label=_label(run.name, same),
            color=st.colour,
            linestyle=st.line,
            marker=st.marker,
            markersize=5,
            markevery=(k % every, every),
            linewidth=1.4,
        )
    ax.set_ylabel(f"fleet power (kW, {res.evaluation.power_bin_s:g} s mean)")
    ax.set_title("fleet power over time")
    ax.grid(alpha=0.3)
    _note_same(ax, same, "power", [run.name for run in res.runs])
    return same


def draw_gpus_on(ax: Any, res: EvaluationResult, look: dict[str, Style]) -> None:
    """GPUs on over time (steps), one line per planner, integer axis."""
    window = res.evaluation.duration_s
    series = {run.name: _gpus_on(run, window) for run in res.runs}
    changes = sorted({t for times, _ in series.values() for t in times})
    same = coinciding({n: [_at(s, t) for t in changes] for n, s in series.items()}, 1e-9)
    counts = [c for _, cs in series.values() for c in cs]
    for run in res.runs:
        times, steps = series[run.name]
        st = look[run.name]
        ax.step(
            times,
            steps,
            where="post",
            color=st.colour,
            linestyle=st.line,
            linewidth=1.4,
            label=_label(run.name, same),
        )
    lo, hi = (min(counts), max(counts)) if counts else (0.0, 1.0)
    ax.set_ylim(lo - 0.6, hi + 0.6)
    ticker: Any = importlib.import_module("matplotlib.ticker")
    ax.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.set_xlabel("time (min)")
    ax.set_ylabel("GPUs on")
    ax.grid(alpha=0.3)
    _note_same(ax, same, "GPUs on", [run.name for run in res.runs])


def draw_saving(ax: Any, res: EvaluationResult, look: dict[str, Style]) -> None:
    """Energy saved against the reference: one labelled bar per planner."""
    ref = next((r for r in res.runs if r.name == res.evaluation.reference), None)
    names = [run.name for run in res.runs]
    ys = list(range(len(names)))[::-1]
    ref_j = ref.result.energy_j if ref is not None else 0.0
    values = [100 * (1 - run.result.energy_j / ref_j) if ref_j > 0 else 0.0 for run in res.runs]
    for y, run, v in zip(ys, res.runs, values, strict=True):
        ax.barh(y, v, color=look[run.name].colour, height=0.6, edgecolor="black", linewidth=0.5)
        text = "reference" if run.name == res.evaluation.reference else f"{v:.1f} %"
        kwh = run.result.energy_j / 3.6e6
        ax.annotate(
            f"{text} ({kwh:.3g} kWh)",
            (max(v, 0.0), y),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    lo = min(min(values), 0.0)
    hi = max(max(values), 1.0)
    ax.set_xlim(lo - 0.05 * (hi - lo), hi + 0.55 * (hi - lo))
    ax.set_yticks(ys)
    ax.set_yticklabels(names, fontsize=8)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel(f"energy saved against {res.evaluation.reference} (%)")
    ax.set_title("energy saved per planner")
    ax.grid(axis="x", alpha=0.3)


def draw_attainment(
    ax: Any, res: EvaluationResult, look: dict[str, Style], per_workload: bool
) -> None:
    """SLO attainment per planner (and per workload), one marker per planner on an
    axis zoomed to the differences, each value labelled; the reference's fleet value
    as a dashed line."""
    groups = ["all"]
    if per_workload and res.runs:
        groups = [s.name for s in res.runs[0].result.stats] + ["all"]
    n = max(len(res.runs), 1)
    values: list[float] = []
    ticks: list[float] = []
    for g, group in enumerate(groups):
        base = (len(groups) - 1 - g) * (n + 1)
        ticks.append(base + (n - 1) / 2)
        for k, run in enumerate(res.runs):
            stats = {s.name: s.slo_attainment for s in run.result.stats}
            value = 100 * (run.result.attainment[2] if group == "all" else stats[group])
            values.append(value)
            y = base + (n - 1 - k)
            st = look[run.name]
            ax.plot(
                [value],
                [y],
                marker=st.marker,
                color=st.colour,
                markersize=7,
                linestyle="none",
                label=run.name if g == 0 else None,
                clip_on=False,
            )
            ax.annotate(
                f"{value:.2f} %",
                (value, y),
                xytext=(-7, 0),
                textcoords="offset points",
                va="center",
                ha="right",
                fontsize=7,
            )
        if g:
            ax.axhline(base + n, color="0.8", linewidth=0.6)
    if values:
        ax.set_xlim(*zoomed_range(values))
    ref = next((r for r in res.runs if r.name == res.evaluation.reference), None)
    if ref is not None:
        ax.axvline(100 * ref.result.attainment[2], color="0.4", linestyle="--", linewidth=0.8)
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"{g}" for g in groups] if per_workload else ["fleet"], fontsize=8)
    if not per_workload:
        ax.set_yticks(
            [n - 1 - k for k in range(len(res.runs))], [run.name for run in res.runs], fontsize=8
        )
    ax.set_ylim(-0.8, len(groups) * (n + 1) - 1.2)
    ax.ticklabel_format(axis="x", useOffset=False, style="plain")
    ax.set_xlabel("SLO attainment (% of requests; axis zoomed to the differences)")
    ref_note = f" (dashed: {res.evaluation.reference}, all workloads)" if ref else ""
    ax.set_title(f"SLO attainment{ref_note}")
    ax.grid(axis="x", alpha=0.3)


def _legend(fig: Any, ax: Any, columns: int) -> None:
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=columns, fontsize=8)


def write_plots(res: EvaluationResult, folder: Path) -> list[Path] | None:
    """evaluation.png (every comparison in one figure), power.png (fleet power and GPUs
    on over time) and slo.png (energy saved, SLO attainment per planner and workload);
    None when matplotlib is missing."""
    plt = _pyplot()
    if plt is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    name = res.evaluation.name
    look = styles([run.name for run in res.runs])
    columns = min(max(len(res.runs), 1), 4)

    fig = plt.figure(figsize=(16, 10), layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=[3, 2], width_ratios=[5, 3])
    left = grid[:, 0].subgridspec(2, 1, height_ratios=[3, 1])
    ax_power = fig.add_subplot(left[0])
    ax_on = fig.add_subplot(left[1], sharex=ax_power)
    draw_power(ax_power, res, look)
    draw_gpus_on(ax_on, res, look)
    draw_saving(fig.add_subplot(grid[0, 1]), res, look)
    draw_attainment(fig.add_subplot(grid[1, 1]), res, look, per_workload=False)
    fig.suptitle(f"{name}: planners compared")
    _legend(fig, ax_power, columns)
    overview = folder / "evaluation.png"
    _save(fig, overview)
    plt.close(fig)

    fig, (ax, ax_on) = plt.subplots(
        2,
        1,
        figsize=(11, 7),
        sharex=True,
        gridspec_kw={"height_ratios": [3, 1]},
        layout="constrained",
    )
    draw_power(ax, res, look)
    draw_gpus_on(ax_on, res, look)
    ax.set_title(f"{name}: fleet power and GPUs on over time")
    _legend(fig, ax, columns)
    power = folder / "power.png"
    _save(fig, power)
    plt.close(fig)

    groups = len(res.runs[0].result.stats) + 1 if res.runs else 1
    height = max(4.0, 0.16 * groups * (len(res.runs) + 1) + 1.5)
    fig, (ax_s, ax_a) = plt.subplots(
        1, 2, figsize=(14, height), width_ratios=[2, 3], layout="constrained"
    )
    draw_saving(ax_s, res, look)
    draw_attainment(ax_a, res, look, per_workload=True)
    fig.suptitle(f"{name}: energy saved and SLO attainment per planner and workload")
    _legend(fig, ax_a, columns)
    slo = folder / "slo.png"
    _save(fig, slo)
    plt.close(fig)
    return [overview, power, slo]


def _save(fig: Any, path: Path) -> None:
    """Save ``fig`` as a PNG at ``path`` by way of a temporary file and a rename."""
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=110, format="png")
    write_bytes_atomic(path, buffer.getvalue())
