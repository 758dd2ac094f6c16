"""Table file format: round trip (numpy and stdlib readers agree), corruption cases."""

from __future__ import annotations

import gc
import hashlib
import itertools
import json
import math
import os
import struct
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energyopt.cli import main
from energyopt.tables import Axis, ColumnData, Table, TableError, write_table
from energyopt.tables.format import LOOKUP_CACHE_ENTRIES
from energyopt.tables.stdlib_reader import (
    ALIGN,
    DIGEST_BYTES,
    MAGIC,
    MAX_HEADER_DEPTH,
    PREFIX,
    StdlibTable,
    TableFormatError,
)


def _write(path: Path) -> None:
    rng = np.random.default_rng(0)
    axes = [
        Axis("wl", "category", ("a", "b", "c")),
        Axis("clock", "exact", (900, 1200, 1500, 1980)),
        Axis("load", "ceil", (0.0, 0.5, 1.0, 2.5, 4.0)),
    ]
    columns = {
        "x": ColumnData(rng.normal(size=(3, 4, 5)), ("wl", "clock", "load"), "<f8", math.nan),
        "n": ColumnData(rng.integers(-9, 9, size=(3, 5)), ("wl", "load"), "<i8", -1),
        "flag": ColumnData(rng.integers(0, 2, size=(3, 4)), ("wl", "clock"), "<u1", 0),
        "f4": ColumnData(rng.normal(size=(4,)), ("clock",), "<f4", 0.0),
    }
    write_table(path, "test", axes, columns, {"note": "unit test"})


@pytest.fixture
def table_file(tmp_path: Path) -> Path:
    path = tmp_path / "t.eot"
    _write(path)
    return path


def test_round_trip_readers_agree_on_every_cell(table_file: Path) -> None:
    t = Table.open(table_file)
    assert t.kind == "test" and t.meta == {"note": "unit test"}
    with StdlibTable(table_file) as s:
        for w in ("a", "b", "c"):
            for clock in (900, 1200, 1500, 1980):
                for load in (0.0, 0.5, 1.0, 2.5, 4.0):
                    a = t.lookup(wl=w, clock=clock, load=load)
                    b = s.lookup(wl=w, clock=clock, load=load)
                    assert a == pytest.approx(b) and a["in_grid"]
                    i = t.axes["wl"].values.index(w)
                    j = t.axes["clock"].values.index(clock)
                    k = t.axes["load"].values.index(load)
                    assert a["x"] == t.array("x")[i, j, k]
        for col in t.columns:
            assert [s.value(col, n) for n in range(t.array(col).size)] == pytest.approx(
                t.array(col).reshape(-1).tolist()
            )
    # memory-mapping alignment: every column starts on a 64-byte boundary
    for col in t.columns.values():
        assert (t.layout.data_start + col.offset) % 64 == 0


def test_ceil_and_fallbacks(table_file: Path) -> None:
    t = Table.open(table_file)
    x = t.array("x")
    assert t.lookup(wl="b", clock=1200, load=0.7)["x"] == x[1, 1, 2]  # 0.7 -> 1.0
    assert t.lookup(wl="b", clock=1200, load=-3)["x"] == x[1, 1, 0]
    out = t.lookup(wl="b", clock=1200, load=4.01)
    assert not out["in_grid"] and math.isnan(out["x"]) and out["n"] == -1
    assert t.lookup(wl="zz", clock=1200, load=1)["flag"] == 0
    assert t.lookup(wl="a", clock=1201, load=1)["flag"] == 0
    assert not t.lookup(wl="a", clock=900, load=float("nan"))["in_grid"]
    with pytest.raises(TableError):
        t.lookup(nope=1)


def test_lookup_many_matches_scalar(table_file: Path) -> None:
    t = Table.open(table_file)
    rng = np.random.default_rng(1)
    wl = rng.choice(["a", "b", "c", "q"], 200)
    clock = rng.choice([900, 1200, 1500, 1980, 1000], 200)
    load = rng.uniform(-1, 5, 200)
    many = t.lookup_many({"wl": wl, "clock": clock, "load": load})
    codes = t.lookup_many(
        {"wl": np.searchsorted(["a", "b", "c"], wl), "clock": clock, "load": load}
    )
    get = t.getter("x", "load", "wl", "clock")
    for n in range(200):
        one = t.lookup(wl=str(wl[n]), clock=int(clock[n]), load=float(load[n]))
        for col in ("x", "n", "flag", "in_grid"):
            assert many[col][n] == pytest.approx(one[col], nan_ok=True)
        if wl[n] != "q":
            assert codes["x"][n] == pytest.approx(one["x"], nan_ok=True)
        assert get(float(load[n]), str(wl[n]), int(clock[n])) == pytest.approx(
            one["x"], nan_ok=True
        )


def _reject(path: Path, pattern: str) -> None:
    with pytest.raises(TableError, match=pattern) as numpy_err:
        Table.open(path)
    assert str(path) in str(numpy_err.value)
    with pytest.raises(TableFormatError, match=pattern):
        StdlibTable(path)


def test_truncated(table_file: Path) -> None:
    data = table_file.read_bytes()
    for cut in (0, 10, PREFIX.size + 5, len(data) - 1):
        table_file.write_bytes(data[:cut])
        _reject(table_file, "truncated")


def test_flipped_byte(table_file: Path) -> None:
    data = bytearray(table_file.read_bytes())
    data[-100] ^= 0x01
    table_file.write_bytes(bytes(data))
    _reject(table_file, "checksum mismatch")


def test_wrong_version_and_magic(table_file: Path) -> None:
    data = bytearray(table_file.read_bytes())
    struct.pack_into("<I", data, 8, 2)
    table_file.write_bytes(bytes(data))
    _reject(table_file, "format version 2")
    data[:8] = b"PK\x03\x04xxxx"
    table_file.write_bytes(bytes(data))
    _reject(table_file, "not an energyopt table")


def test_cli_inspect_and_rejects(table_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(table_file)]) == 0
    assert "ok" in capsys.readouterr().out
    assert main(["lookup", str(table_file), "wl=b", "clock=900", "load=0.2"]) == 0
    assert "in_grid = True" in capsys.readouterr().out
    table_file.write_bytes(table_file.read_bytes()[:-3])
    assert main(["inspect", str(table_file)]) == 2
    assert "truncated" in capsys.readouterr().err


@pytest.fixture(scope="module")
def shared_table(tmp_path_factory: pytest.TempPathFactory) -> Table:
    path = tmp_path_factory.mktemp("fast") / "t.eot"
    _write(path)
    return Table.open(path)


KEY_VALUES = {
    "wl": st.sampled_from(["a", "b", "c", "zz", "", None, 3, float("nan")]),
    "clock": st.sampled_from([900, 1200, 1500.0, 1980, "1200", 1000, None, float("nan"), [1]]),
    "load": st.one_of(
        st.floats(-1, 5, allow_nan=False),
        st.sampled_from([0.0, 2.5, 4.0, float("inf"), float("-inf"), float("nan"), "x", None]),
    ),
}


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_precompiled_lookups_equal_the_column_by_column_path(
    data: st.DataObject, shared_table: Table
) -> None:
    t = shared_table
    names = data.draw(st.permutations(["wl", "clock", "load"]))
    names = names[: data.draw(st.integers(1, 3))]
    key = {n: data.draw(KEY_VALUES[n]) for n in names}
    slow = t.lookup_once(**key)
    fast = t.lookup(**key)
    assert fast.keys() == slow.keys()
    for col, value in slow.items():
        assert fast[col] == pytest.approx(value, nan_ok=True)
    columns, get = t.row_getter(*names)
    row = get(*key.values())
    assert len(row) == len(columns) + 1 and row[-1] == slow["in_grid"]
    for col, value in zip(columns, row, strict=False):
        assert value == pytest.approx(slow[col], nan_ok=True)
    for col in columns:
        one = t.getter(col, *[a for a in names if a in t.columns[col].axes])
        assert one(*[key[a] for a in names if a in t.columns[col].axes]) == pytest.approx(
            slow[col], nan_ok=True
        )


def test_lookup_results_are_independent_copies(table_file: Path) -> None:
    t = Table.open(table_file)
    first = t.lookup(wl="a", clock=900, load=1.0)
    first["x"] = "changed"
    assert t.lookup(wl="a", clock=900, load=1.0)["x"] == t.array("x")[0, 0, 2]
    with pytest.raises(TableError, match="not keyed within"):
        t.row_getter("wl", columns=["x"])


def test_a_column_with_no_axes_holds_one_item(tmp_path: Path) -> None:
    path = tmp_path / "scalar.eot"
    columns = {
        "s": ColumnData(np.asarray(3.5), (), "<f8", math.nan),
        "v": ColumnData(np.asarray([1, 2]), ("a",), "<i4", -1),
    }
    write_table(path, "test", [Axis("a", "category", ("x", "y"))], columns)
    t = Table.open(path)
    assert t.array("s").shape == () and t.lookup() == {"s": 3.5, "in_grid": True}
    assert t.lookup(a="y") == t.lookup_once(a="y") == {"s": 3.5, "v": 2, "in_grid": True}
    assert t.lookup(a="z") == {"s": 3.5, "v": -1, "in_grid": False}
    assert t.row_getter()[1]() == (3.5, True) and t.getter("s")() == 3.5
    with StdlibTable(path) as s:
        assert s.lookup(a="y") == {"s": 3.5, "v": 2, "in_grid": True}


def _with_nested_meta(table: Path, out: Path, levels: int) -> None:
    """A copy of ``table`` whose meta holds ``x``: lists nested ``levels`` deep (the
    header object is level 1, meta level 2), with a correct checksum."""
    raw = table.read_bytes()
    _, _, _, length = PREFIX.unpack_from(raw, 0)
    text = raw[PREFIX.size : PREFIX.size + length].decode()
    data = raw[(PREFIX.size + length + ALIGN - 1) // ALIGN * ALIGN : len(raw) - DIGEST_BYTES]
    head = text.replace('"meta":{', f'"meta":{{"x":{_nested(levels)},', 1).encode()
    prefix = PREFIX.pack(MAGIC, 1, 0, len(head)) + head
    body = prefix + b"\x00" * (-len(prefix) % ALIGN) + data
    out.write_bytes(body + hashlib.sha256(body).digest())


def _nested(levels: int) -> str:
    return "[" * levels + "]" * levels


# The header object is level 1 and meta level 2: meta.x nested k levels is 2 + k.
@pytest.mark.parametrize("levels", [MAX_HEADER_DEPTH - 1, 10_000])
def test_a_deeply_nested_header_is_a_clean_error_naming_the_file(
    table_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], levels: int
) -> None:
    path = tmp_path / "deep.eot"
    _with_nested_meta(table_file, path, levels)  # 10,000: deeper than json follows
    for argv in (["inspect", str(path)], ["lookup", str(path), "wl=a"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"{path}: corrupted header: nested more than 64 levels"), err
    with pytest.raises(TableFormatError, match="nested more than 64 levels"):
        StdlibTable(path)


def test_a_header_nested_64_levels_is_read_and_written(table_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "deep.eot"
    _with_nested_meta(table_file, path, MAX_HEADER_DEPTH - 2)
    nested = _nested(MAX_HEADER_DEPTH - 2)
    assert Table.open(path).lookup(wl="a", clock=900, load=0.0)["in_grid"]
    with StdlibTable(path) as s:
        assert s.lookup(wl="a", clock=900, load=0.0)["in_grid"]
    axes = [Axis("wl", "category", ("a",))]
    write_table(tmp_path / "ok.eot", "test", axes, {}, {"x": json.loads(nested)})
    with pytest.raises(ValueError, match="meta nests deeper"):
        write_table(tmp_path / "no.eot", "test", axes, {}, {"x": [json.loads(nested)]})


SEVEN = (  # the shape of a tiered operating-point table: 280,800 cells on all axes
    Axis("tier", "category", ("gold", "standard", "batch")),
    Axis("wl", "category", ("a", "b", "c")),
    Axis("gpu", "category", ("h", "a")),
    Axis("clock", "exact", tuple(range(600, 1800, 100))),
    Axis("share", "exact", (25, 50, 75, 100)),
    Axis("used", "ceil", (0.0, 25.0, 50.0, 75.0, 100.0)),
    Axis("load", "ceil", tuple(0.5 * i for i in range(65))),
)


@pytest.fixture(scope="module")
def seven_axes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("seven") / "t.eot"
    size = {a.name: len(a.values) for a in SEVEN}
    rng = np.random.default_rng(2)

    def column(axes: tuple[str, ...], dtype: str, fallback: float) -> ColumnData:
        shape = tuple(size[a] for a in axes)
        return ColumnData(rng.normal(100, 50, size=shape), axes, dtype, fallback)

    op = ("tier", "wl", "gpu", "clock", "share")
    place = ("tier", "wl", "gpu", "clock", "used", "load")
    columns = {
        "power_w": column((*op, "load"), "<f8", math.nan),
        "capacity_rps": column(op, "<f8", 0.0),
        "best_clock": column(("tier", "wl", "gpu", "load"), "<i8", -1),
        "place_share": column(place, "<i4", -1),
        "place_power_w": column(place, "<f4", math.nan),
    }
    write_table(path, "test", SEVEN, columns)
    return path


def _in_grid_key(rng: np.random.Generator) -> dict[str, Any]:
    key: dict[str, Any] = {}
    for axis in SEVEN:
        value = axis.values[int(rng.integers(len(axis.values)))]
        key[axis.name] = value - 0.1 if axis.kind == "ceil" else value
    return key


def test_one_compiled_lookup_per_set_of_key_names_and_a_bounded_cache(seven_axes: Path) -> None:
    t = Table.open(seven_axes)
    rng = np.random.default_rng(3)
    key = _in_grid_key(rng)
    names = list(key)
    expected = t.lookup_once(**key)
    for _ in range(20):  # shuffled orders of one set of names: one entry, one answer
        rng.shuffle(names)
        assert t.lookup(**{n: key[n] for n in names}) == expected
    assert len(t._lookups) == 1
    # every one of the 127 non-empty sets of names: at most the stated bound is kept
    for r in range(1, len(SEVEN) + 1):
        for subset in itertools.combinations(names, r):
            part = {n: key[n] for n in subset}
            assert t.lookup(**part) == t.lookup_once(**part)
    assert len(t._lookups) == LOOKUP_CACHE_ENTRIES < 127


def test_a_table_that_served_lookups_is_freed_without_the_garbage_collector(
    seven_axes: Path,
) -> None:
    key = _in_grid_key(np.random.default_rng(4))
    gc.disable()
    try:
        t = Table.open(seven_axes)
        t.lookup(**key)
        t.lookup(**dict(reversed(key.items())))
        t.lookup(tier="gold", wl="a", gpu="h", load=1e9)  # outside: the fallback path
        _, row = t.row_getter("tier", "wl", "gpu", "load")
        one = t.getter("capacity_rps")
        assert row("gold", "a", "h", 1.0)[-1] and one("gold", "a", "h", 600, 25) > -1e9
        ref = weakref.ref(t)
        mapped = weakref.ref(t.array("capacity_rps").base)  # the memory-mapped file
        del t
        assert ref() is None  # freed at once: no cycle waits for a collection
        assert mapped() is not None  # the getters read it
        del row, one
        assert mapped() is None  # unmapped as soon as nothing reads it
    finally:
        gc.enable()


def _resident_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc/self/statm")
def test_a_million_lookups_in_shuffled_orders_on_a_reopened_table_keep_memory_flat(
    seven_axes: Path,
) -> None:
    # 100 opens of the table x 10,000 lookups, each with its names in a random
    # order (the 7 axes in all, or the 4 of best_clock), 1 in 10 outside the grid.
    # The process's resident memory stays within 16 MiB of what it is after the
    # first lookup of each set of names (the cache of compiled rows grew by about
    # 190 MB per order of the 7 names of a table of this shape, and by as much per
    # table opened, until a garbage collection).
    rng = np.random.default_rng(5)
    keys = []
    for n in range(10_000):
        key = _in_grid_key(rng)
        if n % 10 == 0:
            key["load"] = 1e9
        names = list(key) if n % 3 else ["tier", "wl", "gpu", "load"]
        rng.shuffle(names)
        keys.append({name: key[name] for name in names})
    margin = 16 * 2**20

    def check(after: str) -> None:
        grown = _resident_bytes() - baseline
        assert grown <= margin, f"{grown / 2**20:.1f} MiB more after {after}"

    gc.disable()  # flat without any help from the collector
    try:
        t = Table.open(seven_axes)
        t.lookup(**keys[0])  # the 4 names
        t.lookup(**keys[1])  # the 7 names
        baseline = _resident_bytes()
        for block in range(100):
            t = t if block == 0 else Table.open(seven_axes)
            lookup = t.lookup
            for n, key in enumerate(keys):
                lookup(**key)
                if block == 0:  # every lookup at first: a leak fails fast, not OOM
                    check(f"{n + 1} lookups")
            assert lookup(**keys[block]) == t.lookup_once(**keys[block])
            del t, lookup
            check(f"{block + 1} opens and {10_000 * (block + 1):,} lookups")
    finally:
        gc.enable()
