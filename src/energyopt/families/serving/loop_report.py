"""The evaluation table and its CSV files."""

from __future__ import annotations

import contextlib
import csv
import io
import textwrap
from collections.abc import Iterator
from pathlib import Path

from energyopt.families.serving.loop import EvaluationResult, PlannerRun
from energyopt.spec.io import write_text_atomic

HEADER = (
    "planner",
    "energy kWh",
    "saving",
    "TTFT att.",
    "TBT att.",
    "SLO att.",
    "GPUs on",
    "solve s/epoch",
    "model kWh",
    "sim/model",
    "migrations",
)

COLUMNS = {
    "energy kWh": "simulated fleet energy in [0, {window}): static (each GPU on at its locked "
    "clock, idle while powering on, standby while off) plus every iteration's energy",
    "saving": "energy below {reference}: 1 - energy / energy({reference})",
    "TTFT att.": "requests whose time to first token met the TTFT SLO",
    "TBT att.": "token gaps (each output token after the first) within the TBT SLO",
    "SLO att.": "requests that met both: TTFT, and mean time per later token within the TBT SLO",
    "GPUs on": "time-average number of GPUs on over the window",
    "solve s/epoch": "mean wall time of one planning call (s)",
    "model kWh": "what the plans predict for the same window: each plan's own power figure "
    "(its GPUs' on-power at their clocks, plus each placement's power line at its planned "
    "rate: a fixed part while it carries requests plus a part per req/s) times the time "
    "the plan was in force",
    "sim/model": "energy kWh / model kWh",
    "migrations": "serving instances started after time 0 (each loads its weights)",
}
"""One line of the legend under the table per column."""

WHY_MODEL_DIFFERS = (
    "The static parts agree but for powering on and standby. The load-dependent part "
    "differs for two reasons. The forecast: the plans are priced at their planned rates "
    "(forecast x headroom, rounded up), not at the arrivals; 'at arrivals' prices the "
    "same plans at the rates that came. The model: a placement's power is its steady "
    "draw under Poisson arrivals, stated as a line through that draw at its top rate and "
    "at half of it (above the draw below half), while the simulator charges every "
    "iteration at the batch it runs, weight loading and clock changes included "
    "(docs/evaluation.md)."
)


def _saving(run: PlannerRun, ref: PlannerRun | None) -> float | None:
    if ref is None or ref.result.energy_j <= 0:
        return None
    return 1.0 - run.result.energy_j / ref.result.energy_j


def summary_rows(res: EvaluationResult) -> list[dict[str, float | str | int | None]]:
    """One record per planner (energies in J, attainments as fractions)."""
    ref = next((r for r in res.runs if r.name == res.evaluation.reference), None)
    rows: list[dict[str, float | str | int | None]] = []
    for run in res.runs:
        r = run.result
        ttft, tbt, slo = r.attainment
        rows.append(
            {
                "planner": run.name,
                "kind": run.kind,
                "energy_j": r.energy_j,
                "energy_total_j": r.energy_total_j,
                "saving": _saving(run, ref),
                "ttft_attainment": ttft,
                "tbt_attainment": tbt,
                "slo_attainment": slo,
                "mean_gpus_on": r.mean_gpus_on,
                "solver_s_per_epoch": run.solver_s_per_epoch,
                "solver_s_max": max(run.solver_s, default=0.0),
                "solves": run.tally.solves,
                "static_j": r.meter.window_static_j,
                "predicted_j": run.tally.predicted_j,
                "predicted_static_j": run.tally.predicted_static_j,
                "predicted_arrivals_j": run.tally.predicted_arrivals_j,
                "migrations": r.instances_started,
                "arrived": r.arrived,
                "completed": r.completed,
                "unfinished": r.unfinished,
                "shed": r.shed,
                "online_decisions": r.online.decisions if r.online else None,
                "online_max_lookups": r.online.max_lookups if r.online else None,
                "online_lookup_budget": r.online_budget if r.online else None,
                "online_boosts": r.online.boosts if r.online else None,
                "online_spills": r.online.spills if r.online else None,
                "online_wakes": r.online.wakes if r.online else None,
                "online_guard_raises": r.online.guard_raises if r.online else None,
                "shortfall_epochs": run.tally.shortfall_epochs,
                "unproven_shortfall_epochs": run.tally.unproven_shortfall_epochs,
                "unplanned_epochs": run.tally.unplanned_epochs,
                "time_limited_plans": run.tally.time_limited_plans,
                "rejected_plans": run.tally.rejected_plans,
                "surprise_replans": run.tally.surprise_replans,
                "surprise_fallbacks": run.tally.surprise_fallbacks,
                "surprise_s_max": max(run.tally.surprise_s, default=0.0),
                "consolidations": run.tally.consolidations,
                "consolidations_declined": run.tally.consolidations_declined,
            }
        )
    return rows


def workload_attainment(run: PlannerRun) -> dict[str, float]:
    """Each workload's SLO attainment in ``run`` (fraction of its arrived requests
    that met TTFT and TPOT; shed and unfinished requests count as misses)."""
    return {s.name: s.slo_attainment for s in run.result.stats}


def workload_points(run: PlannerRun, ref: PlannerRun) -> dict[str, float]:
    """Per workload, ``run``'s SLO attainment minus ``ref``'s, in percentage points
    (negative: ``run`` met fewer of that workload's requests)."""
    mine = workload_attainment(run)
    theirs = workload_attainment(ref)
    missing = sorted(set(theirs) - set(mine))
    if missing:
        raise ValueError(f"{run.name}: no attainment for workload(s) {missing} of {ref.name}")
    return {name: 100.0 * (mine[name] - theirs[name]) for name in theirs}


def format_table(res: EvaluationResult) -> list[str]:
    """The comparison table, one line per planner, then notes."""
    ev = res.evaluation
    rows = summary_rows(res)
    cells = [list(HEADER)]
    for row in rows:
        saving = row["saving"]
        cells.append(
            [
                str(row["planner"]),
                f"{float(row['energy_j'] or 0) / 3.6e6:.3f}",
                "-" if saving is None else f"{100 * float(saving):.1f}%",
                f"{100 * float(row['ttft_attainment'] or 0):.2f}%",
                f"{100 * float(row['tbt_attainment'] or 0):.2f}%",
                f"{100 * float(row['slo_attainment'] or 0):.2f}%",
                f"{float(row['mean_gpus_on'] or 0):.2f}",
                f"{float(row['solver_s_per_epoch'] or 0):.2f}",
                f"{float(row['predicted_j'] or 0) / 3.6e6:.3f}",
                _ratio(float(row["energy_j"] or 0), float(row["predicted_j"] or 0)),
                str(row["migrations"]),
            ]
        )
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    lines = [
        f"evaluation {ev.name}: {len(res.arrivals)} requests over {ev.duration_s:g} s, "
        f"epoch {ev.epoch_s:g} s, forecast {ev.forecast.method} x{ev.forecast.headroom:g}, "
        f"seed {ev.seed}",
    ]
    for c in cells:
        lines.append(
            "  ".join(
                c[i].ljust(widths[i]) if i == 0 else c[i].rjust(widths[i]) for i in range(len(c))
            )
        )
    lines.extend(legend(res, rows))
    for row in rows:
        notes = []
        if row["unfinished"]:
            notes.append(f"{row['unfinished']} requests unfinished after the drain")
        if row["shortfall_epochs"]:
            unproven = row["unproven_shortfall_epochs"]
            notes.append(
                f"{row['shortfall_epochs']} epochs planned below the forecast"
                + (f" ({unproven} not proven: more may be servable)" if unproven else "")
            )
        if row["unplanned_epochs"]:
            notes.append(f"{row['unplanned_epochs']} epochs without a new plan")
        if row["time_limited_plans"]:
            notes.append(
                f"{row['time_limited_plans']} epoch plans from a solve its time limit cut "
                "(a rerun may plan otherwise)"
            )
        if row["rejected_plans"]:
            notes.append(f"{row['rejected_plans']} plans rejected by the verifier")
        if row["surprise_replans"]:
            fallbacks = row["surprise_fallbacks"]
            notes.append(
                f"{row['surprise_replans']} re-plans on surprise (longest "
                f"{float(row['surprise_s_max'] or 0):.2f} s"
                + (f"; {fallbacks} by the full solve" if fallbacks else "")
                + ")"
            )
        if row["consolidations"] or row["consolidations_declined"]:
            notes.append(
                f"{row['consolidations']} consolidations on a drop "
                f"({row['consolidations_declined']} more re-planned and not applied: no GPU "
                "fewer, or the saving until the next epoch did not pay the transitions)"
            )
        if notes:
            lines.append(f"note: {row['planner']}: " + "; ".join(notes))
    for line in res.skipped:
        lines.append(f"skipped: {line}")
    for line in res.failed:
        lines.append(f"failed: {line}")
    return lines


def _ratio(energy_j: float, predicted_j: float) -> str:
    return f"x{energy_j / predicted_j:.2f}" if predicted_j > 0 else "-"


def legend(
    res: EvaluationResult, rows: list[dict[str, float | str | int | None]]
) -> list[str]:
    """The lines under the table: what each column means, and the simulated energy
    against the model's, split into its static and load-dependent parts."""
    ev = res.evaluation
    width = max(len(h) for h in HEADER)
    lines = ["columns:"]
    for name in HEADER[1:]:
        text = COLUMNS[name].format(window=f"{ev.duration_s:g} s", reference=ev.reference)
        wrapped = textwrap.wrap(text, 100 - width - 4)
        lines.append(f"  {name.ljust(width)}  {wrapped[0]}")
        lines.extend(f"  {'':{width}}  {more}" for more in wrapped[1:])
    lines.append(
        "energy kWh against model kWh, split (kWh): static + load-dependent; at arrivals: "
        "the same plans on the model at the rates that arrived"
    )
    name_width = max(len(str(row["planner"])) for row in rows) if rows else 0
    for row in rows:
        sim_static = float(row["static_j"] or 0) / 3.6e6
        sim_total = float(row["energy_j"] or 0) / 3.6e6
        model_static = float(row["predicted_static_j"] or 0) / 3.6e6
        model_total = float(row["predicted_j"] or 0) / 3.6e6
        arrivals = float(row["predicted_arrivals_j"] or 0) / 3.6e6
        lines.append(
            f"  {str(row['planner']).ljust(name_width)}  simulated {sim_static:.3f} + "
            f"{sim_total - sim_static:.3f}   model {model_static:.3f} + "
            f"{model_total - model_static:.3f}   at arrivals {arrivals:.3f}"
        )
    lines.extend(f"  {line}" for line in textwrap.wrap(WHY_MODEL_DIFFERS, 98))
    return lines


@contextlib.contextmanager
def _written(path: Path) -> Iterator[io.StringIO]:
    """A text buffer written to ``path`` (temporary file and rename) when the block
    ends without an error: an interrupted evaluation never leaves half a CSV."""
    buffer = io.StringIO(newline="")
    yield buffer
    write_text_atomic(path, buffer.getvalue())


def write_csvs(res: EvaluationResult, folder: Path) -> list[Path]:
    """summary.csv, workloads.csv, power.csv and gpus_on.csv (step changes) in
    ``folder``; their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = summary_rows(res)
    out = []
    path = folder / "summary.csv"
    with _written(path) as fh:
        if rows:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    out.append(path)
    path = folder / "workloads.csv"
    with _written(path) as fh:
        w = csv.writer(fh)
        w.writerow(
            [
                "planner",
                "workload",
                "arrived",
                "completed",
                "ttft_attainment",
                "tbt_attainment",
                "slo_attainment",
                "ttft_p_ms",
                "tbt_p_ms",
                "percentile",
            ]
        )
        for run in res.runs:
            for s in run.result.stats:
                q = s.slo.quantile
                w.writerow(
                    [
                        run.name,
                        s.name,
                        s.arrived,
                        s.completed,
                        f"{s.ttft_attainment:.6f}",
                        f"{s.tbt_attainment:.6f}",
                        f"{s.slo_attainment:.6f}",
                        f"{s.ttft_percentile_ms(q):.3f}",
                        f"{s.tbt_percentile_ms(q):.3f}",
                        s.slo.percentile,
                    ]
                )
    out.append(path)
    path = folder / "power.csv"
    with _written(path) as fh:
        w = csv.writer(fh)
        w.writerow(["time_s", *(run.name for run in res.runs)])
        length = max((len(run.result.power_w) for run in res.runs), default=0)
        bin_s = res.evaluation.power_bin_s
        for k in range(length):
            values = [
                f"{run.result.power_w[k]:.1f}" if k < len(run.result.power_w) else ""
                for run in res.runs
            ]
            w.writerow([f"{k * bin_s:g}", *values])
    out.append(path)
    path = folder / "gpus_on.csv"
    with _written(path) as fh:
        w = csv.writer(fh)
        w.writerow(["planner", "time_s", "gpus_on"])
        for run in res.runs:
            for t, count in run.result.gpus_on:
                w.writerow([run.name, f"{t:g}", count])
    out.append(path)
    return out
