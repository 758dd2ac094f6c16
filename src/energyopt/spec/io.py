"""Reading and writing spec files (YAML, JSON, TOML) with errors that name file and field."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import stat
import tempfile
import tomllib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import tomli_w
import yaml
from pydantic import BaseModel, ValidationError

from energyopt.spec.errors import SpecError

M = TypeVar("M", bound=BaseModel)

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_YAML_ALIASES = 256
MAX_ALIAS_EXPANSION = 100_000
"""Values YAML aliases may add to a file beyond those written out in it: a few
hundred aliases that each double the one before stay under MAX_YAML_ALIASES but
expand to 2**100 values, which every later walk (validation, printing) would hang on."""
MAX_NESTING = 64
"""Levels of nested mappings and lists a file may have (the deepest bundled file has 9)."""
SUFFIXES = {".yaml": "yaml", ".yml": "yaml", ".json": "json", ".toml": "toml"}


class _GuardedLoader(yaml.SafeLoader):
    """Safe YAML loader that refuses alias explosions ("billion laughs") and
    duplicate keys (a repeated key would silently keep only its last value)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise yaml.YAMLError(
                    f"more than {MAX_YAML_ALIASES} aliases: refusing a possible YAML bomb"
                )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key_node, yaml.CollectionNode) or not _hashable(key):
                    raise yaml.constructor.ConstructorError(
                        None, None, "a mapping key must be a plain value", key_node.start_mark
                    )
                if isinstance(key, str) and key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark
                    )
                seen.add(key)
        return dict(super().construct_mapping(node, deep=deep))


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


class DuplicateKeyError(ValueError):
    """A JSON object repeats a key."""


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object; a repeated key is an error (it would keep only its last value)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(f"duplicate key {key!r}")
        out[key] = value
    return out


def file_format(path: Path) -> str:
    """'yaml', 'json' or 'toml' from the suffix; SpecError otherwise."""
    fmt = SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise SpecError(
            [f"{path}: unknown file type {path.suffix!r}; use .yaml, .yml, .json or .toml"]
        )
    return fmt


def read_bytes(path: str | Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; SpecError naming the file.

    A FIFO, a device (``/dev/zero``, also behind a symlink), a socket or a folder is
    refused before anything is read from it: reading one would block forever or never
    end. The file is opened without blocking and checked again on the open descriptor,
    so a FIFO put in its place between the two checks is refused as well."""
    p = Path(path)
    regular_file_size(p)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise SpecError([f"{p}: cannot read: {exc.strerror or exc}"]) from None
    with os.fdopen(fd, "rb") as fh:
        try:
            info = os.fstat(fd)
            _require_regular(p, info.st_mode)
            if info.st_size > limit:
                raise SpecError([f"{p}: file is {info.st_size} bytes, more than {limit}"])
            payload = fh.read(limit + 1)
        except OSError as exc:
            raise SpecError([f"{p}: cannot read: {exc.strerror or exc}"]) from None
    if len(payload) > limit:
        raise SpecError([f"{p}: file is more than {limit} bytes"])
    return payload


def regular_file_size(path: str | Path) -> int:
    """The size in bytes of ``path``, a regular file (a symlink to one is fine);
    SpecError naming it when it is missing, or a FIFO, device, socket or folder, which
    a reader would wait on forever or read without end."""
    p = Path(path)
    try:
        info = os.stat(p)
    except OSError as exc:
        raise SpecError([f"{p}: cannot read: {exc.strerror or exc}"]) from None
    _require_regular(p, info.st_mode)
    return info.st_size


def _require_regular(path: Path, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    what = (
        "a folder"
        if stat.S_ISDIR(mode)
        else "a FIFO (named pipe)"
        if stat.S_ISFIFO(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "not a regular file"
    )
    raise SpecError([f"{path}: cannot read: {what}, not a regular file"])


def read_text(path: str | Path, limit: int = MAX_FILE_BYTES) -> str:
    """``read_bytes`` decoded as UTF-8 (a leading byte-order mark is dropped)."""
    p = Path(path)
    try:
        return read_bytes(p, limit).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecError([f"{p}: cannot read as UTF-8 text: {exc}"]) from None


_IN_MEMORY: ContextVar[Mapping[str, Mapping[str, Any]]] = ContextVar(
    "energyopt_documents_in_memory", default=MappingProxyType({})
)


@contextlib.contextmanager
def in_memory(name: str, data: Mapping[str, Any]) -> Iterator[None]:
    """Within the block, ``read_data(name)`` returns a copy of ``data`` (a document
    already parsed, e.g. ``<dict>``) checked as a file's contents are, instead of reading
    a file: every loader then takes the mapping as it takes a file, and its errors name
    ``name``. Paths the document names are relative to the current directory."""
    token = _IN_MEMORY.set({**_IN_MEMORY.get(), name: data})
    try:
        yield
    finally:
        _IN_MEMORY.reset(token)


def read_data(path: str | Path, fmt: str | None = None) -> dict[str, Any]:
    """Parse a file into a mapping; SpecError naming the file for any problem.

    ``fmt`` ('yaml', 'json' or 'toml') overrides the format the suffix names. Within
    ``in_memory(name, data)``, ``read_data(name)`` is a checked copy of ``data``."""
    held = _IN_MEMORY.get().get(str(path))
    if held is not None:
        return _checked_mapping(copy.deepcopy(held), str(path), "document")
    p = Path(path)
    fmt = fmt or file_format(p)
    text = read_text(p)
    if not text.strip():
        raise SpecError([f"{p}: file is empty"])
    try:
        if fmt == "yaml":
            data: Any = yaml.load(text, Loader=_GuardedLoader)
        elif fmt == "json":
            data = json.loads(text, object_pairs_hook=_json_object)
        else:
            data = tomllib.loads(text)
    except yaml.YAMLError as exc:
        raise SpecError([f"{p}: malformed YAML: {_one_line(str(exc))}"]) from None
    except json.JSONDecodeError as exc:
        raise SpecError([f"{p}: malformed JSON: {exc.msg} at line {exc.lineno}"]) from None
    except DuplicateKeyError as exc:
        raise SpecError([f"{p}: malformed JSON: {exc}"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError([f"{p}: malformed TOML: {exc}"]) from None
    except RecursionError:
        raise SpecError([f"{p}: malformed {fmt.upper()}: nested too deeply"]) from None
    return _checked_mapping(data, str(p), f"malformed {fmt.upper()}")


def _checked_mapping(data: Any, source: str, malformed: str) -> dict[str, Any]:
    """``data`` when it is a mapping with settings, neither too deep nor too large
    through aliases; SpecError naming ``source`` otherwise (``malformed``: how a shape
    problem is introduced, e.g. 'malformed YAML')."""
    if data is None:
        raise SpecError([f"{source}: file is empty"])
    if not isinstance(data, dict):
        raise SpecError([f"{source}: top level must be a mapping, got {type(data).__name__}"])
    if not data:
        raise SpecError([f"{source}: file has no settings (an empty mapping)"])
    shape = _shape_problem(data)
    if shape:
        raise SpecError([f"{source}: {malformed}: {shape}"])
    return data


def _shape_problem(data: Any) -> str | None:
    """Why ``data`` is too deep or, through YAML aliases, too large or recursive; None if
    it is neither. A container reached twice (one YAML anchor, many aliases) is walked
    once, so this takes time in the size of the file, not of its expansion."""
    sizes: dict[int, int] = {}  # id of a finished container -> values in it, expanded
    open_ids = {id(data)}  # containers being walked (one met again is a recursive value)
    leaves, inner = _split(data)
    written = 1 + leaves  # values as the file writes them (an alias counts once)
    # stack of [container, its containers, next one, depth, values so far (expanded)]
    stack: list[list[Any]] = [[data, inner, 0, 1, 1 + leaves]]
    while stack:
        top = stack[-1]
        node, inner, i, depth, total = top
        if i == len(inner):
            stack.pop()
            open_ids.discard(id(node))
            sizes[id(node)] = total
            if stack:
                stack[-1][4] += total
            continue
        top[2] = i + 1
        child = inner[i]
        if id(child) in open_ids:
            return "an alias refers to a mapping or list that holds it (a recursive value)"
        if id(child) in sizes:
            top[4] += sizes[id(child)]
            written += 1
            continue
        if depth >= MAX_NESTING:
            return f"nested too deeply (more than {MAX_NESTING} levels)"
        open_ids.add(id(child))
        leaves, grandchildren = _split(child)
        written += 1 + leaves
        stack.append([child, grandchildren, 0, depth + 1, 1 + leaves])
    total = sizes[id(data)]
    if total > written + MAX_ALIAS_EXPANSION:
        return (
            f"aliases expand it to {_count(total)} values from {written:,} written out, more than "
            f"{MAX_ALIAS_EXPANSION:,} added: refusing a possible YAML bomb"
        )
    return None


def _count(n: int) -> str:
    return f"{n:,}" if n < 10**12 else f"{n:.3g}"


def _split(node: Any) -> tuple[int, list[Any]]:
    """The plain values (keys included) and the mappings and lists directly in ``node``."""
    values = list(node.values()) if isinstance(node, dict) else node
    inner = [v for v in values if isinstance(v, dict | list)]
    keys = len(node) if isinstance(node, dict) else 0
    return keys + len(values) - len(inner), inner


def file_kind(path: str | Path) -> str:
    """Problem family of an instance file: its top-level ``kind:``, ``serving`` if absent."""
    return data_kind(read_data(path), path)


def data_kind(data: dict[str, Any], path: str | Path) -> str:
    """``kind:`` of parsed ``data`` (``serving`` if absent); ``path`` names the file in errors."""
    kind = data.get("kind", "serving")
    if not isinstance(kind, str):
        raise SpecError([f"{path}: kind: should be a string, got {kind!r}"])
    return kind


def _one_line(text: str) -> str:
    return " ".join(text.split())


def field_path(loc: tuple[int | str, ...], data: Any = None) -> str:
    """Render a pydantic location as ``workloads[0](chat).rate_rps``."""
    out = ""
    node = data
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            if isinstance(node, list) and 0 <= part < len(node):
                node = node[part]
                if isinstance(node, dict) and isinstance(node.get("name"), str) and node["name"]:
                    out += f"({node['name']})"
            else:
                node = None
        else:
            out += f".{part}" if out else str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return out or "(top level)"


def validation_problems(exc: ValidationError, source: str, data: Any = None) -> list[str]:
    """One 'source: field: message' line per pydantic error."""
    errors = [
        (tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p)), err)
        for err in exc.errors()
    ]
    lines = []
    for loc, err in errors:
        # pydantic also reports a list as too short when its only items were invalid;
        # that follows from the item errors and is false about the file, so leave it out
        if err["type"] == "too_short" and any(
            len(other) > len(loc) and other[: len(loc)] == loc for other, _ in errors
        ):
            continue
        lines.append(f"{source}: {field_path(loc, data)}: {err['msg']}")
    return lines


def parse(model: type[M], data: dict[str, Any], source: str) -> M:
    """Validate ``data`` as ``model``; SpecError naming ``source`` and each field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SpecError(validation_problems(exc, source, data)) from None


def load(model: type[M], path: str | Path) -> M:
    """Read and validate a file as ``model``."""
    return parse(model, read_data(path), str(path))


def dump(obj: BaseModel, path: str | Path) -> None:
    """Write ``obj`` to ``path`` in the format its suffix names (defaults left out)."""
    dump_data(obj.model_dump(mode="json", exclude_none=True), path)


def dump_data(data: dict[str, Any], path: str | Path) -> None:
    """Write ``data`` (JSON types, no None) to ``path`` atomically, as YAML, JSON or TOML
    by its suffix; SpecError naming ``path`` for another suffix or a failed write."""
    p = Path(path)
    fmt = file_format(p)
    if fmt == "json":
        text = json.dumps(data, indent=2) + "\n"
    elif fmt == "yaml":
        text = yaml.safe_dump(data, sort_keys=False)
    else:
        text = tomli_w.dumps(data)  # tables and arrays of tables, one field a line
    write_text_atomic(p, text)


def write_bytes_atomic(path: str | Path, payload: bytes) -> None:
    """Write ``payload`` to a temporary file next to ``path`` and rename it over
    ``path``: a reader sees the old file or the whole new one, never a part.
    SpecError naming the path if it cannot be written."""
    if not str(path).strip():  # Path("") is ".", and the rename said "Device or resource busy"
        raise SpecError(["(empty file name): cannot write: give the file to write"])
    p = Path(path)
    try:
        mode: int | None = os.stat(p).st_mode
    except OSError:
        mode = None  # no such file yet (or unreadable: mkstemp below says why)
    if mode is not None and not stat.S_ISREG(mode):
        # the rename would replace a folder's entry, or a device such as /dev/null as root
        what = "a folder" if stat.S_ISDIR(mode) else "not a regular file (a device, FIFO or socket)"
        raise SpecError([f"{p}: cannot write: {what}; give the file to write"])
    folder = p.parent if str(p.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise SpecError([f"{p}: cannot write: {exc.strerror or exc}"]) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, p)
    except OSError as exc:
        _remove_quietly(tmp)
        raise SpecError([f"{p}: cannot write: {exc.strerror or exc}"]) from None
    except BaseException:
        _remove_quietly(tmp)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    """``write_bytes_atomic`` of ``text`` in UTF-8."""
    write_bytes_atomic(path, text.encode("utf-8"))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def dumps_json(obj: BaseModel) -> str:
    """``obj`` as indented JSON."""
    return json.dumps(obj.model_dump(mode="json", exclude_none=True), indent=2) + "\n"
