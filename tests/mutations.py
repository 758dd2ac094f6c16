"""Edits of instance data (nested dicts and lists) for bad-input tests.

``set_at`` and ``delete_at`` are single hand-written edits; ``edits`` is a
hypothesis strategy of the four edits a careless or hostile user makes to any
file: delete a key, change a leaf to a value of the wrong type, put a
non-finite or extreme number anywhere, repeat a key. ``render`` writes the
edited data as JSON, YAML or TOML text (a repeated key needs a hand-made
writer: no serializer will repeat one).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml
from hypothesis import strategies as st

Mutation = Callable[[dict[str, Any]], None]
Path_ = tuple[str | int, ...]


def set_at(*keys: str | int, value: Any) -> Mutation:
    """A mutation that sets ``data[k0][k1]...[kn] = value``."""

    def mutate(data: dict[str, Any]) -> None:
        node: Any = data
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return mutate


def delete_at(*keys: str | int) -> Mutation:
    """A mutation that deletes ``data[k0][k1]...[kn]``."""

    def mutate(data: dict[str, Any]) -> None:
        node: Any = data
        for key in keys[:-1]:
            node = node[key]
        del node[keys[-1]]

    return mutate


EXTREME_VALUES: tuple[Any, ...] = (
    math.nan,
    math.inf,
    -math.inf,
    1e308,
    -1e308,
    2**62,
    10**40,
    1e-300,
    1e9,
    1e-9,
    65_536,
    0,
    -1,
)
"""Non-finite, huge and tiny numbers, large ones within most ranges, zero, negative."""

WRONG_TYPES: tuple[Any, ...] = ("fast", "", [], {}, True, None, [1, 2], {"a": 1}, 7)
"""Values of every JSON type; the edit picks one whose type differs from the leaf's."""


@dataclass(frozen=True)
class Edit:
    """One edit: ``op`` (delete, retype, extreme, duplicate) at ``path`` with ``value``."""

    op: str
    path: Path_
    value: Any = None

    def describe(self) -> str:
        """Short text for test reports: ``extreme workloads.0.rate_rps = inf``."""
        where = ".".join(str(p) for p in self.path) or "(top level)"
        shown = "" if self.op == "delete" else f" = {self.value!r}"[:60]
        return f"{self.op} {where}{shown}"

    def field(self) -> str | None:
        """The last key name on the path (what an error should name), if any."""
        names = [p for p in self.path if isinstance(p, str)]
        return names[-1] if names else None


def nodes(data: Any, path: Path_ = ()) -> list[tuple[Path_, Any]]:
    """Every (path, value) below ``data`` (the root excluded), depth first."""
    out: list[tuple[Path_, Any]] = []
    items: list[tuple[str | int, Any]]
    if isinstance(data, dict):
        items = list(data.items())
    elif isinstance(data, list):
        items = list(enumerate(data))
    else:
        return out
    for key, value in items:
        out.append(((*path, key), value))
        out.extend(nodes(value, (*path, key)))
    return out


def _same_kind(a: Any, b: Any) -> bool:
    def kind(x: Any) -> str:
        if isinstance(x, bool):
            return "bool"
        if isinstance(x, int | float):
            return "number"
        return type(x).__name__

    return kind(a) == kind(b)


@st.composite
def edits(draw: st.DrawFn, data: dict[str, Any], ops: tuple[str, ...] | None = None) -> Edit:
    """One edit of ``data`` (not applied): the operation, where, and the new value.

    ``ops`` limits the operations (delete, retype, extreme, number, duplicate);
    ``number`` is ``extreme`` aimed at a numeric leaf, so that numbers, which the
    other operations reach rarely in a file of names and text, get half the
    extreme values."""
    every = nodes(data)
    maps = [p for p, v in every if isinstance(v, dict) and v]
    keyed = [p for p, _ in every if isinstance(p[-1], str)]
    leaves = [p for p, v in every if not isinstance(v, dict | list)]
    numbers = [p for p, v in every if isinstance(v, int | float) and not isinstance(v, bool)]
    choices = [
        op
        for op, where in (
            ("delete", keyed),
            ("retype", leaves),
            ("extreme", [p for p, _ in every]),
            ("number", numbers),
            ("duplicate", [(), *maps]),
        )
        if where and (ops is None or op in ops)
    ]
    op = draw(st.sampled_from(choices))
    if op == "number":  # a number made extreme: the edit most likely to get through
        value = draw(st.sampled_from(EXTREME_VALUES))
        return Edit("extreme", draw(st.sampled_from(numbers)), value)
    if op == "delete":
        return Edit(op, draw(st.sampled_from(keyed)))
    if op == "retype":
        path = draw(st.sampled_from(leaves))
        old = get(data, path)
        value = draw(st.sampled_from([v for v in WRONG_TYPES if not _same_kind(v, old)]))
        return Edit(op, path, value)
    if op == "extreme":
        path = draw(st.sampled_from([p for p, _ in every]))
        return Edit(op, path, draw(st.sampled_from(EXTREME_VALUES)))
    path = draw(st.sampled_from([(), *maps]))
    mapping = get(data, path)
    key = draw(st.sampled_from(sorted(mapping)))
    # the repeat keeps the value (a harmless-looking copy) or changes it
    value = draw(st.sampled_from([mapping[key], *EXTREME_VALUES[:2], "other"]))
    return Edit(op, (*path, key), value)


def get(data: Any, path: Path_) -> Any:
    """``data[p0][p1]...``."""
    node = data
    for key in path:
        node = node[key]
    return node


def apply(data: dict[str, Any], edit: Edit) -> dict[str, Any]:
    """A copy of ``data`` with ``edit`` made (a duplicate is made by ``render``)."""
    out = copy.deepcopy(data)
    if edit.op == "duplicate":
        return out
    parent = get(out, edit.path[:-1])
    if edit.op == "delete":
        del parent[edit.path[-1]]
    else:
        parent[edit.path[-1]] = edit.value
    return out


def _json_text(data: Any, dup: Path_ | None, value: Any, path: Path_ = ()) -> str:
    """JSON (NaN and Infinity as Python writes them), with ``dup``'s key repeated."""
    if isinstance(data, dict):
        parts = [
            f"{json.dumps(str(k))}: {_json_text(v, dup, value, (*path, k))}"
            for k, v in data.items()
        ]
        if dup is not None and dup[:-1] == path:
            parts.append(f"{json.dumps(str(dup[-1]))}: {_json_text(value, None, None)}")
        return "{" + ", ".join(parts) + "}"
    if isinstance(data, list):
        return (
            "[" + ", ".join(_json_text(v, dup, value, (*path, i)) for i, v in enumerate(data)) + "]"
        )
    return json.dumps(data)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        items = [
            f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items() if v is not None
        ]
        return "{ " + ", ".join(items) + " }"
    raise TypeError(type(value).__name__)


def _toml_text(data: dict[str, Any], dup: Path_ | None, value: Any) -> str:
    """Top-level ``key = value`` lines (None, which TOML lacks, leaves its key out)."""
    lines = [f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in data.items() if v is not None]
    if dup is not None and len(dup) == 1 and value is not None:
        lines.append(f"{json.dumps(str(dup[0]))} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def render(data: dict[str, Any], edit: Edit, fmt: str) -> str:
    """``data`` (already edited by ``apply``) as text in ``fmt``: json, yaml or toml."""
    dup = edit.path if edit.op == "duplicate" else None
    if fmt == "toml":
        return _toml_text(data, dup, edit.value)
    if fmt == "yaml" and dup is None:
        return yaml.safe_dump(data, sort_keys=False)
    # YAML reads JSON text too (flow style), which lets a key repeat
    return _json_text(data, dup, edit.value)


def check_family_file_mutations(
    tmp_path: Any,
    original: dict[str, Any],
    solvers: tuple[str, ...],
    *,
    extra_args: tuple[str, ...] = (),
    max_examples: int = 30,
) -> None:
    """Every mutation of ``original`` (a problem file of a family, as data) is either
    refused by ``energyopt validate`` with exit 2 and a message that starts with the
    file's path, or solved by each of ``solvers`` without an internal error, and any
    plan written is accepted by ``energyopt verify``. ``extra_args`` (e.g. a
    ``--catalog``) go to every command."""
    import contextlib
    import io
    from pathlib import Path

    from hypothesis import HealthCheck, given, settings

    from energyopt.cli import EXIT_BAD_INPUT, EXIT_OK, main

    folder = Path(tmp_path)

    def cli(*argv: str) -> tuple[int, str]:
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                code = main([*argv, *extra_args])
            except SystemExit as exc:
                code = int(exc.code or 0)
        return code, err.getvalue()

    @settings(
        max_examples=max_examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(edit=edits(original), fmt=st.sampled_from(("yaml", "json")))
    def check(edit: Edit, fmt: str) -> None:
        path = folder / f"mutated.{fmt}"
        path.write_text(render(apply(original, edit), edit, fmt), encoding="utf-8")
        code, err = cli("validate", str(path))
        assert "Traceback" not in err and "internal error" not in err, (edit.describe(), err)
        if code != EXIT_OK:
            assert code == EXIT_BAD_INPUT and err.startswith(f"{path}"), (edit.describe(), err)
            return
        for solver in solvers:
            plan = folder / "plan.json"
            plan.unlink(missing_ok=True)
            code, err = cli("solve", str(path), "--solver", solver, "-q", "-o", str(plan))
            assert "Traceback" not in err and "internal error" not in err, (edit.describe(), err)
            if plan.exists():
                code, err = cli("verify", str(path), str(plan))
                assert code == EXIT_OK, (edit.describe(), solver, err)

    check()
