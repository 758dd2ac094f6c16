"""Load catalog entries from the shipped ``models/`` folder and from user files."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from energyopt.spec.errors import SpecError
from energyopt.spec.hardware import GpuType
from energyopt.spec.io import parse, read_data, validation_problems
from energyopt.spec.llm import LlmModel


@dataclass(frozen=True)
class Catalog:
    """GPU types and LLMs by name."""

    gpus: dict[str, GpuType] = field(default_factory=dict)
    models: dict[str, LlmModel] = field(default_factory=dict)

    def merged(
        self,
        gpus: tuple[GpuType, ...] | list[GpuType],
        models: tuple[LlmModel, ...] | list[LlmModel],
    ) -> Catalog:
        """A new catalog where ``gpus`` and ``models`` add to or replace entries by name."""
        new_gpus = dict(self.gpus)
        new_gpus.update({g.name: g for g in gpus})
        new_models = dict(self.models)
        new_models.update({m.name: m for m in models})
        return Catalog(new_gpus, new_models)

    def gpu(self, name: str) -> GpuType:
        """GPU type by name; KeyError with close matches in the message."""
        try:
            return self.gpus[name]
        except KeyError:
            raise KeyError(_unknown("GPU type", name, self.gpus)) from None

    def model(self, name: str) -> LlmModel:
        """LLM by name; KeyError with close matches in the message."""
        try:
            return self.models[name]
        except KeyError:
            raise KeyError(_unknown("model", name, self.models)) from None


def _unknown(kind: str, name: str, known: dict[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.4)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown {kind} {name!r}{hint} (known: {', '.join(sorted(known))})"


def _models_dir() -> Path:
    """The shipped catalog: package data in a wheel, or ``models/`` of a source checkout."""
    packaged = resources.files("energyopt") / "_models"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[3] / "models"


@lru_cache(maxsize=1)
def builtin_catalog() -> Catalog:
    """Every entry under ``models/gpus`` and ``models/llms``."""
    root = _models_dir()
    gpus: list[GpuType] = []
    models: list[LlmModel] = []
    for path in sorted((root / "gpus").glob("*.yaml")):
        gpus.append(parse(GpuType, read_data(path), str(path)))
    for path in sorted((root / "llms").glob("*.yaml")):
        models.append(parse(LlmModel, read_data(path), str(path)))
    if not gpus or not models:
        raise SpecError([f"{root}: embedded catalog is missing or empty"])
    return Catalog().merged(gpus, models)


def load_catalog_file(path: str | Path) -> tuple[list[GpuType], list[LlmModel]]:
    """A user catalog file: top-level ``gpus:`` and ``models:`` lists."""
    data = read_data(path)
    unknown = set(data) - {"gpus", "models"}
    if unknown:
        raise SpecError([f"{path}: {k}: unknown key (expected gpus, models)" for k in unknown])
    gpus: list[GpuType] = []
    models: list[LlmModel] = []
    problems: list[str] = []
    for key, cls, out in (("gpus", GpuType, gpus), ("models", LlmModel, models)):
        entries = data.get(key, [])
        if not isinstance(entries, list):
            problems.append(f"{path}: {key}: must be a list")
            continue
        seen: set[str] = set()
        for i, entry in enumerate(entries):
            try:
                valid = cls.model_validate(entry)
                if valid.name in seen:
                    problems.append(
                        f"{path}: {key}[{i}]({valid.name}).name: {valid.name!r} is given twice"
                    )
                seen.add(valid.name)
                out.append(valid)  # type: ignore[arg-type]
            except ValidationError as exc:
                for line in validation_problems(exc, str(path), entry):
                    field = line.removeprefix(f"{path}: ").removeprefix("(top level)")
                    sep = "" if field.startswith(":") else "."
                    problems.append(f"{path}: {key}[{i}]{sep}{field}")
    if problems:
        raise SpecError(problems)
    return gpus, models


def bind_catalog(
    files: Sequence[tuple[str, str | Path]] = (),
    inline_gpus: Sequence[GpuType] = (),
    inline_models: Sequence[LlmModel] = (),
    extra: Sequence[str | Path] = (),
) -> tuple[Catalog, list[str]]:
    """The catalog a file is bound to, and the problems met building it.

    One rule for every family: the embedded catalog, then each of the file's own
    catalog files (labelled, e.g. ``inst.yaml: catalog[0]``), then its inline
    entries, then the command line's ``--catalog`` files; a later entry replaces an
    earlier one of the same name. A file that cannot be read is reported with its
    label and skipped.
    """
    catalog = builtin_catalog()
    problems: list[str] = []
    labelled = [*files, *((f"--catalog {p}", p) for p in extra)]
    inline_at = len(files)
    for i, (label, path) in enumerate(labelled):
        if i == inline_at:
            catalog = catalog.merged(list(inline_gpus), list(inline_models))
        try:
            gpus, models = load_catalog_file(path)
        except SpecError as exc:
            problems.extend(f"{label}: {p}" for p in exc.problems)
            continue
        catalog = catalog.merged(gpus, models)
    if inline_at == len(labelled):
        catalog = catalog.merged(list(inline_gpus), list(inline_models))
    return catalog, problems
