"""Replaying a production trace: read it, rescale its rate, assign its requests to
workloads.

Rules (docs/evaluation.md):

* **Rate scaling by superposition.** To scale the trace's rate by ``s``, take
  ``k = ceil(s)`` copies of the trace window, shift copy ``j`` circularly by
  ``j / k`` of the window (so copies do not burst together), and keep each
  request independently with probability ``s / k``. The burst structure of the
  trace at its own time scale is kept; more users make the sum smoother.
* **Assignment to workloads.** Each request is assigned independently to
  workload ``w`` with probability ``rate_w / sum(rates)`` of the base instance
  (seeded), so every workload sees a thinned copy of the trace's arrival process
  and its token-length mix.
* **Tokens.** ``trace``: the request's own ContextTokens and GeneratedTokens;
  ``scaled``: those multiplied per workload so their means equal the workload's
  prompt and output means (the trace's shape, the workload's size).
"""

from __future__ import annotations

import csv
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from energyopt.sim.arrivals import Arrivals, FloatArray, IntArray, merge
from energyopt.spec.errors import SpecError
from energyopt.spec.io import regular_file_size
from energyopt.spec.workload import Workload

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


MAX_TRACE_BYTES = 1024 * 1024 * 1024
"""Largest trace file read (1 GiB, some 20 million requests)."""
MAX_TOKENS = 100_000_000
"""Most tokens of one request's prompt or output."""


def _row(p: Path, line: int, row: dict[str | Any, Any]) -> tuple[float, int, int]:
    """(timestamp s, prompt, output) of one CSV row; SpecError naming line and column."""
    values: list[float | int] = []
    for column in COLUMNS:
        text = row.get(column)
        if not isinstance(text, str) or not text.strip():
            raise SpecError([f"{p}: line {line}: {column}: missing value"])
        try:
            if column == "TIMESTAMP":
                values.append(datetime.fromisoformat(text.strip()).timestamp())
            else:
                values.append(int(text))
        except (ValueError, OverflowError, OSError) as exc:
            raise SpecError([f"{p}: line {line}: {column}: {text.strip()[:40]!r}: {exc}"]) from None
    stamp, prompt, output = values
    for column, tokens in zip(COLUMNS[1:], (prompt, output), strict=True):
        if not 0 <= tokens <= MAX_TOKENS:
            raise SpecError(
                [f"{p}: line {line}: {column}: {tokens} is outside 0..{MAX_TOKENS:,} tokens"]
            )
    return float(stamp), int(prompt), int(output)


def read_trace(path: str | Path) -> tuple[FloatArray, IntArray, IntArray]:
    """Arrival times (s from the first request), prompt and output tokens, sorted.

    SpecError naming the file (and the line and column) for a file that is not a
    UTF-8 CSV with the COLUMNS, a row with a missing or malformed value, or one
    larger than MAX_TRACE_BYTES."""
    p = Path(path)
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    size = regular_file_size(p)  # a FIFO or device is refused before it is opened
    try:
        if size > MAX_TRACE_BYTES:
            raise SpecError([f"{p}: file is {size:,} bytes, more than {MAX_TRACE_BYTES:,}"])
        with p.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise SpecError([f"{p}: header: missing column(s) {', '.join(missing)}"])
            for line, row in enumerate(reader, start=2):
                stamp, prompt, output = _row(p, line, row)
                times.append(stamp)
                prompts.append(max(prompt, 1))
                outputs.append(max(output, 1))
    except OSError as exc:
        raise SpecError([f"{p}: cannot read: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError:
        raise SpecError([f"{p}: not a UTF-8 text (CSV) file"]) from None
    except csv.Error as exc:
        raise SpecError([f"{p}: malformed CSV: {exc}"]) from None
    if not times:
        raise SpecError([f"{p}: no requests"])
    t = np.asarray(times)
    order = np.argsort(t, kind="stable")
    t = t[order] - t[order][0]
    return (
        t,
        np.asarray(prompts, dtype=np.int64)[order],
        np.asarray(outputs, dtype=np.int64)[order],
    )


def superpose(
    times_s: FloatArray, span_s: float, scale: float, rng: np.random.Generator
) -> tuple[FloatArray, IntArray]:
    """Times of the rescaled trace and the source row of each (see module docs)."""
    copies = max(1, math.ceil(scale - 1e-12))
    keep_p = scale / copies
    out_t: list[FloatArray] = []
    out_i: list[IntArray] = []
    rows = np.arange(times_s.shape[0], dtype=np.int64)
    for j in range(copies):
        shifted = np.mod(times_s + j * span_s / copies, span_s)
        keep = rng.random(times_s.shape[0]) < keep_p
        out_t.append(shifted[keep])
        out_i.append(rows[keep])
    t = np.concatenate(out_t)
    i = np.concatenate(out_i)
    order = np.argsort(t, kind="stable")
    return t[order], i[order]


def trace_arrivals(
    path: str | Path,
    workloads: tuple[Workload, ...],
    *,
    start_s: float,
    duration_s: float,
    load_scale: float,
    tokens: str,
    seed: int,
) -> Arrivals:
    """Requests of the trace window [start_s, start_s + duration_s), rescaled so the
    mean rate is ``load_scale`` times the workloads' summed rate, assigned to them."""
    t_all, prompt_all, output_all = read_trace(path)
    end = t_all[-1]
    if start_s >= end:
        raise SpecError([f"{path}: start_s {start_s:g} s is past the trace's end ({end:.0f} s)"])
    span = min(duration_s, end - start_s)
    lo, hi = np.searchsorted(t_all, [start_s, start_s + span], side="left")
    t = t_all[lo:hi] - start_s
    if t.shape[0] == 0:
        raise SpecError([f"{path}: no requests in [{start_s:g}, {start_s + span:g}) s"])
    rates = np.asarray([w.rate_rps for w in workloads])
    target_rps = load_scale * float(rates.sum())
    scale = target_rps / (t.shape[0] / span)
    rng = np.random.default_rng(seed)
    times, rows = superpose(t, span, scale, rng)
    # a window shorter than the duration repeats (circularly) to fill it
    reps = math.ceil(duration_s / span)
    times = np.concatenate([times + r * span for r in range(reps)])
    rows = np.concatenate([rows for _ in range(reps)])
    keep = times < duration_s
    times, rows = times[keep], rows[keep]
    which = np.asarray(
        rng.choice(len(workloads), size=times.shape[0], p=rates / rates.sum()), dtype=np.int64
    )
    prompt = prompt_all[lo:hi][rows].astype(np.float64)
    output = output_all[lo:hi][rows].astype(np.float64)
    if tokens == "scaled":
        for k, w in enumerate(workloads):
            mine = which == k
            if mine.any():
                prompt[mine] *= w.prompt_tokens.mean / prompt[mine].mean()
                output[mine] *= w.output_tokens.mean / output[mine].mean()
    names = tuple(w.name for w in workloads)
    return merge(
        [
            (
                times,
                which,
                np.maximum(np.rint(prompt), 1).astype(np.int64),
                np.maximum(np.rint(output), 1).astype(np.int64),
            )
        ],
        names,
    )
