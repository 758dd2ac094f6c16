"""Read and write function invocation traces in the format of the Azure Functions
invocation trace 2021 (Azure/AzurePublicDataset, AzureFunctionsInvocationTrace2021.md;
Zhang et al., "Faster and Cheaper Serverless Computing on Harvested Resources",
SOSP 2021).

One CSV row per invocation, header ``app,func,end_timestamp,duration``: the
application id, the function id (unique only within its application), the
invocation's end timestamp and its duration, both in seconds. An invocation starts
at ``end_timestamp - duration``. Files ending in ``.gz`` are gzip-compressed, in
``.xz`` xz-compressed.

The trace has no memory or trigger columns, so the generated functions' profiles
(``energyopt.families.keepalive.function_workload.FunctionProfile``) travel in a second CSV, header
``app,func,kind,arrival,daily_invocations,mean_duration_s,memory_mb,model``.

Bad input raises ``SpecError`` naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import gzip
import io
import lzma
import math
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from energyopt.families.keepalive.function_workload import (
    ARRIVAL_CLASSES,
    FunctionProfile,
    FunctionTrace,
    InvocationTrace,
    start_order,
)
from energyopt.families.keepalive.llm_functions import MODELS
from energyopt.spec.errors import SpecError

TRACE_COLUMNS = ("app", "func", "end_timestamp", "duration")
"""Header of the Azure Functions invocation trace 2021."""
PROFILE_COLUMNS = (
    "app",
    "func",
    "kind",
    "arrival",
    "daily_invocations",
    "mean_duration_s",
    "memory_mb",
    "model",
)
"""Header of the function profiles that go with a generated trace."""


def _read_text(path: Path) -> str:
    """The file's text (decompressed where the name ends in .gz or .xz)."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    elif path.suffix == ".xz":
        data = lzma.decompress(data)
    return data.decode("utf-8")


def _write_text(path: Path, text: str) -> None:
    """Write ``text``, compressed where the name ends in .gz (with no timestamp, so
    the same text gives the same bytes) or .xz."""
    data = text.encode("utf-8")
    if path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    elif path.suffix == ".xz":
        data = lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)
    path.write_bytes(data)


def write_trace(trace: InvocationTrace, path: str | Path) -> int:
    """Write ``trace`` to ``path`` (rows ordered by end timestamp, then app and
    function id; times to the millisecond); returns the number of invocations
    written."""
    path = Path(path)
    apps: list[str] = []
    funcs: list[str] = []
    ends: list[np.ndarray] = []
    durs: list[np.ndarray] = []
    owner: list[np.ndarray] = []
    for i, ft in enumerate(sorted(trace.functions, key=lambda f: (f.app, f.func))):
        apps.append(ft.app)
        funcs.append(ft.func)
        ends.append(np.asarray(ft.end_s, dtype=float))
        durs.append(np.asarray(ft.duration_s, dtype=float))
        owner.append(np.full(len(ft.end_s), i, dtype=np.int64))
    end = np.concatenate(ends) if ends else np.zeros(0)
    dur = np.concatenate(durs) if durs else np.zeros(0)
    who = np.concatenate(owner) if owner else np.zeros(0, dtype=np.int64)
    order = np.lexsort((who, end))
    lines = [",".join(TRACE_COLUMNS)]
    for k in order:
        i = int(who[k])
        lines.append(f"{apps[i]},{funcs[i]},{end[k]:.3f},{dur[k]:.3f}")
    _write_text(path, "\n".join(lines) + "\n")
    return len(order)


def _number(path: Path, line: int, column: str, text: str, *, lowest: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SpecError([f"{path}: line {line}: {column}: not a number: {text!r}"]) from None
    if not math.isfinite(value) or value < lowest:
        raise SpecError(
            [f"{path}: line {line}: {column}: must be a finite number >= {lowest:g}, not {text}"]
        )
    return value


def _rows(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, the named columns stripped) of every non-empty row of a CSV file
    with a header holding ``columns``; SpecError names the file and line of a missing
    column, a short row or an empty ``app`` or ``func`` id."""
    try:
        with io.StringIO(_read_text(path), newline="") as fh:
            reader = csv.reader(fh)
            try:
                header = [h.strip() for h in next(reader)]
            except StopIteration:
                raise SpecError(
                    [f"{path}: line 1: empty file, expected the header {','.join(columns)}"]
                ) from None
            missing = [c for c in columns if c not in header]
            if missing:
                raise SpecError(
                    [
                        f"{path}: line 1: header lacks column {', '.join(missing)} "
                        f"(expected {','.join(columns)}, found {','.join(header)})"
                    ]
                )
            col = {c: header.index(c) for c in columns}
            width = max(col.values()) + 1
            for row in reader:
                line = reader.line_num
                if not row:
                    continue
                if len(row) < width:
                    raise SpecError(
                        [f"{path}: line {line}: {len(row)} fields, the header has {width}"]
                    )
                fields = {c: row[k].strip() for c, k in col.items()}
                for name in ("app", "func"):
                    if not fields[name]:
                        raise SpecError([f"{path}: line {line}: {name}: empty id"])
                yield line, fields
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise SpecError([f"{path}: cannot be read: {exc}"]) from None


def read_trace(path: str | Path, horizon_s: float | None = None) -> InvocationTrace:
    """Read an invocation trace; ``horizon_s`` defaults to the latest end timestamp.
    Raises SpecError naming the file, line and column of a bad row."""
    path = Path(path)
    ends: dict[tuple[str, str], list[float]] = defaultdict(list)
    durs: dict[tuple[str, str], list[float]] = defaultdict(list)
    for line, get in _rows(path, TRACE_COLUMNS):
        end = _number(path, line, "end_timestamp", get["end_timestamp"], lowest=0.0)
        dur = _number(path, line, "duration", get["duration"], lowest=0.0)
        ends[(get["app"], get["func"])].append(end)
        durs[(get["app"], get["func"])].append(dur)
    functions = []
    latest = 0.0
    for key in ends:
        end_s = np.asarray(ends[key])
        dur_s = np.asarray(durs[key])
        order = start_order(end_s, dur_s)
        functions.append(FunctionTrace(key[0], key[1], end_s[order], dur_s[order]))
        latest = max(latest, float(end_s.max()))
    return InvocationTrace(tuple(functions), latest if horizon_s is None else horizon_s)


def write_profiles(profiles: list[FunctionProfile], path: str | Path) -> None:
    """Write the function profiles that go with a generated trace."""
    fh = io.StringIO()
    w = csv.writer(fh, lineterminator="\n")
    w.writerow(PROFILE_COLUMNS)
    for p in profiles:
        w.writerow(
            [
                p.app,
                p.func,
                p.kind,
                p.arrival,
                f"{p.daily_invocations:.6g}",
                f"{p.mean_duration_s:.6g}",
                f"{p.memory_mb:.6g}",
                p.model,
            ]
        )
    _write_text(Path(path), fh.getvalue())


def read_profiles(path: str | Path) -> list[FunctionProfile]:
    """Read function profiles; SpecError names the file, line and column of a bad row."""
    path = Path(path)
    out: list[FunctionProfile] = []
    seen: set[tuple[str, str]] = set()
    for line, get in _rows(path, PROFILE_COLUMNS):
        if (get["app"], get["func"]) in seen:
            raise SpecError([f"{path}: line {line}: app, func: {get['app']},{get['func']} twice"])
        seen.add((get["app"], get["func"]))
        kind = get["kind"]
        if kind not in ("cpu", "gpu"):
            raise SpecError([f"{path}: line {line}: kind: cpu or gpu, not {kind!r}"])
        arrival = get["arrival"]
        if arrival not in ARRIVAL_CLASSES:
            raise SpecError(
                [
                    f"{path}: line {line}: arrival: one of {', '.join(ARRIVAL_CLASSES)}, "
                    f"not {arrival!r}"
                ]
            )
        arrival_class = next(c for c in ARRIVAL_CLASSES if c == arrival)
        model = get["model"]
        if kind == "gpu" and model not in MODELS:
            raise SpecError(
                [
                    f"{path}: line {line}: model: a GPU function's model is one of "
                    f"{', '.join(MODELS)}, not {model!r}"
                ]
            )
        if kind == "cpu" and model:
            raise SpecError([f"{path}: line {line}: model: a CPU function has none"])
        daily = _number(path, line, "daily_invocations", get["daily_invocations"], lowest=0)
        mean_s = _number(path, line, "mean_duration_s", get["mean_duration_s"], lowest=0)
        memory = _number(path, line, "memory_mb", get["memory_mb"], lowest=0)
        out.append(
            FunctionProfile(
                get["app"],
                get["func"],
                "gpu" if kind == "gpu" else "cpu",
                arrival_class,
                daily,
                mean_s,
                memory,
                model,
            )
        )
    return out
